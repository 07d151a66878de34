"""Serving an AOTInductor package of ``torch.export`` programs (``artifact.format: aoti``, ``artifact.formats``) with
the methods ``service.engine.artifact.Artifact`` calls on a TorchScript module: ``sample_rows``, ``scored_rows`` (when
packaged) and ``forward``.

A package is compiled code: run on another device kind, a CPU without the instruction set it was compiled for or
another torch, it fails, and an illegal instruction kills the process instead of raising. So the manifest's
``artifact.compiled`` is checked first and a mismatch refused with a reason (``CannotRun``); loading needs no
compiler. Reasons never name a path: a loader's own message (which names its temporary files) is cut to its type.
"""

from __future__ import annotations

import platform
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from artifact.formats import Compiled

# torch's CPU capability levels (torch.backends.cpu.get_cpu_capability) an x86 package's instruction set needs
X86_LEVELS = {"DEFAULT": 0, "AVX2": 1, "AVX512": 2}
PATH = re.compile(r"(?:[A-Za-z]:)?/[^\s'\"]+")


class CannotRun(ValueError):
    """This server cannot run the package; the message is the version's ``reason``."""


def major_minor(version: str) -> tuple[str, ...]:
    return tuple(version.split("+")[0].split(".")[:2])


def isa_level(isa: str | None) -> int:
    """The capability level an instruction set string (``AOTI_CPU_ISA``, e.g. "AVX512 AVX512_VNNI") needs; 0 when
    it names no x86 vector extension."""
    words = (isa or "").split()  # blank: no extension named
    return X86_LEVELS.get(words[0].upper(), 0) if words else 0


def check_runnable(compiled: Compiled, target: torch.device) -> None:
    """Raise ``CannotRun`` unless a package compiled as ``compiled`` runs on ``target`` with this torch and CPU."""
    if compiled.device != target.type:
        raise CannotRun(f"the AOTInductor package is compiled for {compiled.device}; this server runs on "
                        f"{target.type} (export it on a {target.type} machine, or serve director.ts)")
    if compiled.torch is not None and major_minor(compiled.torch) != major_minor(torch.__version__):
        raise CannotRun(f"the AOTInductor package is compiled by torch {compiled.torch}; this server runs torch "
                        f"{torch.__version__} (compile it with the serving torch, or serve director.ts)")
    if compiled.machine and compiled.machine != platform.machine():
        raise CannotRun(f"the AOTInductor package is compiled for {compiled.machine}; this server is "
                        f"{platform.machine()}")
    if target.type == "cpu":
        have = torch.backends.cpu.get_cpu_capability()
        if isa_level(compiled.cpu_isa) > X86_LEVELS.get(have, 0):
            raise CannotRun(f"the AOTInductor package needs the CPU instruction set {compiled.cpu_isa}; this CPU "
                            f"offers {have} (compile it on a machine like the server's, or serve director.ts)")


def check_inputs(inputs: tuple[torch.Tensor, ...], bounds: list[list[int | tuple[int, int | None]]]) -> None:
    """Raise ``ValueError`` unless every input's shape is one the package was compiled for: compiled code does not
    check, and reads past a buffer where TorchScript would raise (a text longer than the position table)."""
    if len(inputs) != len(bounds):
        raise ValueError(f"the package takes {len(bounds)} inputs, got {len(inputs)}")
    for i, (tensor, dims) in enumerate(zip(inputs, bounds, strict=True)):
        if tensor.dim() != len(dims):
            raise ValueError(f"input {i} has {tensor.dim()} dimensions, the package takes {len(dims)}")
        for d, (size, bound) in enumerate(zip(tensor.shape, dims, strict=True)):
            low, high = (bound, bound) if isinstance(bound, int) else bound
            if size < low or (high is not None and size > high):
                raise ValueError(f"input {i} dimension {d} is {size}; the package takes {low}..{high or 'any'}")


class CompiledDirector:
    """An AOTInductor package's compiled methods behind the artifact contract's names, each call's input shapes
    checked against the ones it was compiled for (``artifact.compiled.inputs``; unchecked where a manifest has none)."""

    def __init__(self, methods: dict[str, Callable[..., Any]], bounds: list[list[Any]] | None = None) -> None:
        if "sample_rows" not in methods:
            raise CannotRun("the AOTInductor package has no sample_rows")
        self.methods = methods
        self.bounds = bounds
        if "scored_rows" in methods:  # ``hasattr(module, "scored_rows")`` answers as for a TorchScript module
            self.scored_rows = self._scored_rows

    def _call(self, name: str, inputs: tuple[torch.Tensor, ...]) -> Any:
        if self.bounds is not None:
            check_inputs(inputs, self.bounds)
        # compiled code reads its inputs with the strides it was compiled for: a view (a mask cut from a wider one)
        # would be read wrongly, and silently; a contiguous tensor is passed as it is
        return self.methods[name](*(tensor.contiguous() for tensor in inputs))

    def sample_rows(self, *inputs: torch.Tensor) -> torch.Tensor:
        """(model inputs, repeats [B]) -> rows [sum(repeats), C]."""
        return self._call("sample_rows", inputs)

    def _scored_rows(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(model inputs, repeats [B]) -> (rows [sum(repeats), C], per-input scores [B, F])."""
        return self._call("scored_rows", inputs)

    def forward(self, *inputs_and_samples: Any) -> torch.Tensor:
        """(model inputs, n_samples: int) -> logits [S, B, C], as ``ImageDirector.forward`` builds it from rows."""
        *inputs, n_samples = inputs_and_samples
        batch = inputs[0].shape[0]
        repeats = torch.full((batch,), int(n_samples), dtype=torch.long, device=inputs[0].device)  # [B]
        rows = self.sample_rows(*inputs, repeats)  # [B*S, C] grouped by input
        return rows.view(batch, int(n_samples), -1).transpose(0, 1)  # [S, B, C]

    __call__ = forward

    def eval(self) -> CompiledDirector:
        """Compiled for inference already (as ``torch.jit.ScriptModule.eval`` for a loader that calls it)."""
        return self


def load_compiled(path: Path, compiled: Compiled, target: torch.device) -> CompiledDirector:
    """The package's methods on ``target``, after ``check_runnable``."""
    check_runnable(compiled, target)
    from torch._inductor.package import load_package  # only a server that serves a package pays for the import

    index = target.index if target.index is not None else -1
    methods: dict[str, Callable[..., Any]] = {}
    for name in compiled.methods:
        try:
            methods[name] = load_package(str(path), name, device_index=index)
        except Exception as exc:  # a corrupt or foreign package raises many different errors
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise CannotRun(f"the AOTInductor package's {name} failed to load: {type(exc).__name__}: "
                            f"{PATH.sub('<path>', first)[:200]}") from exc
    return CompiledDirector(methods, compiled.inputs)
