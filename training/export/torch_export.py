"""The ``torch.export`` artifact beside TorchScript (``export.format: aoti``, docs/architecture.md): the methods of the
artifact contract the server calls (``sample_rows``, and ``scored_rows`` when the module computes per-input scores),
each exported to an ExportedProgram and compiled ahead of time by AOTInductor, packaged together in one file
(``director.pt2``) for the device the module sits on. ``forward`` is not compiled: the server's loader derives it from
``sample_rows`` exactly as ``ImageDirector.forward`` does.

Choices, and why:

- The row count ``sum(repeats)`` is data-dependent: ``models.director.row_count`` reads it as an unbacked size, so
  one program serves every mix of sample counts. The number of inputs is a dynamic dimension, and so is a text's
  padded length, up to the rows of its position table.
- Random numbers: ``fallback_random`` keeps ``randn`` ATen's own, drawn from the global generator, so the package
  draws exactly what the TorchScript file draws under the same ``torch.manual_seed`` (reproducible, and new numbers
  on every call). Inductor's own generator would draw other numbers, equal only in distribution.
- Buffers (``noise_scale``, the token correlation) are compiled in as constants: a package is fixed at export.
- Compiled code runs on one device kind, one CPU instruction set (the export machine's, at best) and one torch: the
  manifest records them (``artifact.compiled``) so that a server refuses what it cannot run instead of crashing.
- Compiling needs a C++ compiler at export time only; loading a package needs none.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.export import Dim, ExportedProgram
from torch.export.graph_signature import InputKind

from artifact.formats import AOTI_FORMAT, EXPORTED_ARTIFACT
from training.data.images import ForwardArgs
from training.posthoc.ood_selection import returns_input_scores

# Inductor options of every package: ATen's random numbers (the TorchScript artifact's draws under the same seed)
COMPILE_OPTIONS: dict[str, Any] = {"aot_inductor.package": True, "fallback_random": True}


class Method(nn.Module):
    """One method of the artifact module as a module's ``forward``: ``torch.export`` exports ``forward`` only."""

    def __init__(self, module: nn.Module, name: str) -> None:
        super().__init__()
        self.module = module
        self.method = name

    def forward(self, *inputs: torch.Tensor) -> Any:
        return getattr(self.module, self.method)(*inputs)


def exported_methods(module: nn.Module) -> tuple[str, ...]:
    """The methods the server may call on ``module``: ``scored_rows`` only where it computes per-input scores."""
    return ("sample_rows", "scored_rows") if returns_input_scores(module) else ("sample_rows",)


def text_length(module: nn.Module) -> Dim:
    """A text's padded length: 1 up to the rows of the module's position table (a longer text is refused by the
    eager module), unbounded without one (rotary positions)."""
    table = getattr(getattr(module, "embedding", None), "position", None)
    if isinstance(table, torch.Tensor):
        return Dim("length", min=1, max=int(table.shape[0]))
    return Dim("length", min=1)


def example_inputs(module: nn.Module, probe: ForwardArgs) -> tuple[tuple[torch.Tensor, ...], tuple[Any, ...]]:
    """The model inputs ``probe`` ((pixels,) or (ids, mask), at least 2 inputs and 2 tokens, so that no dynamic size
    is specialised) with mixed ``repeats`` 1..B, and their dynamic shapes: the inputs, and a text's length."""
    batch = probe[0].shape[0]
    if batch < 2 or (probe[0].dim() == 2 and probe[0].shape[1] < 2):
        raise ValueError("export needs a probe of at least 2 inputs (of 2 tokens): 1 would specialise the size")
    # fresh contiguous copies: a view (a validation mask cut to its batch's longest text from the padded table) is
    # traced with its base, whose width then pins the dynamic length (a guard "length != max_length" that fails)
    probe = tuple(tensor.clone(memory_format=torch.contiguous_format) for tensor in probe)
    inputs = Dim("inputs", min=1)
    repeats = torch.arange(1, batch + 1, dtype=torch.long, device=probe[0].device)  # [B] mixed sample counts
    length = text_length(module)
    shapes = [{0: inputs, **({1: length} if tensor.dim() == 2 else {})} for tensor in probe]
    return (*probe, repeats), ((*shapes, {0: inputs}),)


def export_methods(module: nn.Module, probe: ForwardArgs) -> dict[str, ExportedProgram]:
    """Every method of ``exported_methods`` as an ExportedProgram (inference: no gradients)."""
    args, shapes = example_inputs(module, probe)
    with torch.no_grad():
        return {name: torch.export.export(Method(module, name), args, dynamic_shapes=shapes)
                for name in exported_methods(module)}


def input_bounds(program: ExportedProgram) -> list[list[int | list[int | None]]]:
    """Per model input, per dimension: its size, or [min, max] (max None: unbounded) where it is dynamic. Compiled
    code does not check its inputs (a longer text would be read past its position table), so the loader does."""
    placeholders = {node.name: node for node in program.graph.nodes if node.op == "placeholder"}
    bounds: list[list[int | list[int | None]]] = []
    for spec in program.graph_signature.input_specs:
        if spec.kind != InputKind.USER_INPUT:
            continue
        dims: list[int | list[int | None]] = []
        for size in placeholders[spec.arg.name].meta["val"].shape:
            if isinstance(size, torch.SymInt):
                span = program.range_constraints[size.node.expr]
                upper = float(span.upper)  # infinity where unbounded
                dims.append([int(span.lower), None if math.isinf(upper) else int(upper)])
            else:
                dims.append(int(size))
        bounds.append(dims)
    return bounds


def compile_package(programs: dict[str, ExportedProgram], path: Path) -> dict[str, str]:
    """AOTInductor-compile every program into one package at ``path`` (one model per method name); returns the
    package's metadata (device, CPU instruction set) as the loader reports it."""
    from torch._inductor.package import load_package, package_aoti

    files = {name: torch._inductor.aot_compile(program.module(), program.example_inputs[0], options=COMPILE_OPTIONS)
             for name, program in programs.items()}
    package_aoti(str(path), files)
    return dict(load_package(str(path), next(iter(programs))).get_metadata())


def compiled_section(metadata: dict[str, str], methods: tuple[str, ...], inputs: list[Any]) -> dict[str, Any]:
    """The manifest's ``artifact.compiled``: what a server must match to run the package, and the input shapes it
    takes (``input_bounds``, the model inputs then ``repeats``)."""
    device = metadata.get("AOTI_DEVICE_KEY") or "cpu"
    isa = metadata.get("AOTI_CPU_ISA") if device == "cpu" else None
    return {"device": device, "methods": list(methods), "inputs": inputs, "cpu_isa": isa or None,
            "compute_capability": metadata.get("AOTI_COMPUTE_CAPABILITY") or None,
            "machine": metadata.get("AOTI_MACHINE") or None,
            "torch": torch.__version__, "random": "ATen generator (fallback_random): the TorchScript file's draws"}


def close(want: torch.Tensor, have: torch.Tensor, scores: bool) -> bool:
    """Logit rows [R, C] within 1e-4; per-input scores [B, F] within 1e-3 of each score's largest magnitude here."""
    if not scores:
        return torch.allclose(want, have, rtol=0.0, atol=1e-4)
    scale = want.abs().amax(dim=0, keepdim=True)  # [1, F]
    return bool(((want - have).abs() <= 1e-3 * scale + 1e-6).all())


def verify_package(path: Path, served: torch.jit.ScriptModule, probe: ForwardArgs, methods: tuple[str, ...]) -> None:
    """Check the package against the served TorchScript module under one seed, at a batch size other than the
    export's (the batch must be symbolic) and with mixed sample counts: rows within 1e-4; each score within 1e-3 of the
    largest magnitude it takes on the probe (relative Mahalanobis is a difference of two distances hundreds of times
    larger than itself, so float32 rounding in another summation order moves it by ~1e-3 of its own value)."""
    from torch._inductor.package import load_package

    inputs = tuple(tensor[:-1].contiguous() for tensor in probe)  # one input fewer than exported, as served
    repeats = torch.arange(inputs[0].shape[0], 0, -1, dtype=torch.long, device=inputs[0].device)  # [b]
    for name in methods:
        compiled = load_package(str(path), name)
        torch.manual_seed(0)
        expected = getattr(served, name)(*inputs, repeats)
        torch.manual_seed(0)
        got = compiled(*inputs, repeats)
        pairs = zip(expected, got, strict=True) if name == "scored_rows" else [(expected, got)]
        for i, (want, have) in enumerate(pairs):
            if want.shape != have.shape or not close(want, have, scores=i == 1):
                raise RuntimeError(f"the compiled {name} differs from the TorchScript artifact's (output {i})")


def write_compiled(module: nn.Module, served: torch.jit.ScriptModule, probe: ForwardArgs, folder: Path
                   ) -> dict[str, Any]:
    """Export, compile and verify ``module`` (the eager artifact module that ``served`` scripts) into
    ``folder/director.pt2``; returns the manifest's ``artifact`` entries that name it."""
    methods = exported_methods(module)
    path = folder / EXPORTED_ARTIFACT
    programs = export_methods(module.eval(), probe)
    metadata = compile_package(programs, path)
    verify_package(path, served, probe, methods)
    inputs = input_bounds(programs["sample_rows"])
    return {"file": EXPORTED_ARTIFACT, "format": AOTI_FORMAT, "compiled": compiled_section(metadata, methods, inputs)}
