"""One timing loop for the raw-artifact benchmarks, and the raw forward of a version timed with it."""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch

from artifact.contract import ARTIFACT, Manifest, parse_manifest, read_document
from artifact.formats import AOTI_FORMAT, artifact_format, compiled_of
from service.engine.artifact import uses_input_scores
from service.engine.exported_artifact import CompiledDirector, load_compiled


def seconds_per_call(call: Callable[[], object], min_calls: int, min_seconds: float,
                     sync: Callable[[], None] = lambda: None) -> float:
    """Mean wall time of ``call`` after one warm-up call: at least ``min_calls`` calls and ``min_seconds``.
    ``sync`` waits for queued device work (``torch.cuda.synchronize`` on a GPU) after every call."""
    call()
    sync()
    calls, start = 0, time.perf_counter()
    while calls < min_calls or time.perf_counter() - start < min_seconds:
        call()
        sync()
        calls += 1
    return (time.perf_counter() - start) / calls


def scripted_module(folder: Path, device: str | torch.device) -> torch.jit.ScriptModule:
    """A version's ``director.ts`` (TorchScript's deprecation warning silenced: it is the promised format)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning)
        return torch.jit.load(str(folder / ARTIFACT), map_location=device).eval()


def compiled_module(folder: Path, manifest: Manifest, device: str | torch.device) -> CompiledDirector:
    """A version's AOTInductor package, behind the loader the server uses."""
    assert manifest.artifact is not None
    return load_compiled(folder / manifest.artifact.file, compiled_of(manifest.artifact), torch.device(device))


def served_module(folder: Path, manifest: Manifest, device: str) -> Any:
    """The module the server runs for a version: its AOTInductor package when the manifest names one, else
    ``director.ts``."""
    if artifact_format(manifest.artifact) == AOTI_FORMAT:
        return compiled_module(folder, manifest, device)
    return scripted_module(folder, device)


def raw_forward(folder: Path, n_samples: int, batch_sizes: list[int], threads: int, min_seconds: float = 0.5,
                device: str = "cpu", bf16: bool = False) -> list[dict[str, Any]]:
    """The artifact of an image version alone (``served_module``), per batch size: the forward the server calls for it
    (``scored_rows`` when its OOD score reads per-input scores, else ``sample_rows``), at least 5 forwards and
    ``min_seconds`` each, with ``threads`` torch threads on ``device`` (bf16 autocast on CUDA when asked, as the server
    does)."""
    torch.set_num_threads(threads)
    manifest = parse_manifest(read_document(folder))
    module = served_module(folder, manifest, device)
    method = "scored_rows" if uses_input_scores(manifest) else "sample_rows"
    shape = (manifest.input.channels, manifest.input.height, manifest.input.width)  # type: ignore[union-attr]
    cuda = device.startswith("cuda")
    out = []
    with torch.inference_mode(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda and bf16):
        for batch in batch_sizes:
            pixels = torch.rand(batch, *shape, device=device)  # [B, C, H, W]
            counts = torch.full((batch,), n_samples, dtype=torch.long, device=device)  # [B]
            seconds = seconds_per_call(partial(getattr(module, method), pixels, counts), 5, min_seconds,
                                       torch.cuda.synchronize if cuda else lambda: None)
            out.append({"method": method, "batch": batch, "n_samples": n_samples, "rows": batch * n_samples,
                        "ms_per_forward": round(seconds * 1000, 3), "inputs_per_s": round(batch / seconds, 1)})
    return out
