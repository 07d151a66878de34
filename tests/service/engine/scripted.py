"""Tiny TorchScript artifacts written to a temp folder, for the engine's loading tests (``service.engine.artifact``,
``service.engine.repository``): a scripted module of a few tensor operations (scripting and loading it take
milliseconds) and a valid manifest listing its sha256. Each input's logits are ``mean(pixels) * weight``, so what a
forward returns is known from its input; ``scale`` multiplies the weight (NaN: non-finite logits)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import torch

from artifact.contract import ARTIFACT, FORMAT_VERSION, MANIFEST, sha256_file

SHAPE = (1, 2, 2)  # (channels, height, width)
LABELS = ["a", "b"]


class TinyDirector(torch.nn.Module):
    """``sample_rows`` only: an artifact whose OOD rule reads no per-input score."""

    def __init__(self, labels: int = len(LABELS), scale: float = 1.0) -> None:
        super().__init__()
        self.register_buffer("weight", torch.linspace(1.0, -1.0, labels) * scale)  # [C]

    def forward(self, pixels: torch.Tensor, n_samples: int) -> torch.Tensor:
        repeats = torch.full((pixels.shape[0],), n_samples, dtype=torch.long)  # [B]
        return self.sample_rows(pixels, repeats).view(pixels.shape[0], n_samples, -1).transpose(0, 1)  # [S, B, C]

    @torch.jit.export
    def sample_rows(self, pixels: torch.Tensor, repeats: torch.Tensor) -> torch.Tensor:
        values = pixels.flatten(1).mean(1)  # [B]
        return (values[:, None] * self.weight[None, :]).repeat_interleave(repeats, 0)  # [sum(repeats), C]


class ScoredDirector(TinyDirector):
    """With ``scored_rows``: the kernel error alone, one value per input (``[B]``, as artifacts before feature-space
    scores return it), equal to the input's mean pixel."""

    @torch.jit.export
    def scored_rows(self, pixels: torch.Tensor, repeats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.sample_rows(pixels, repeats), pixels.flatten(1).mean(1)  # [sum(repeats), C], [B]


def save_module(module: torch.nn.Module, path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit's deprecation notice
        torch.jit.save(torch.jit.script(module), str(path))


def manifest_document(**changes: Any) -> dict[str, Any]:
    """A valid image manifest of ``SHAPE`` and ``LABELS`` (energy at S = 2, threshold 0.5) before its files are
    listed; ``changes`` replace top-level sections."""
    document: dict[str, Any] = {
        "format_version": FORMAT_VERSION, "name": "tiny", "version": "1", "modality": "image", "labels": LABELS,
        "input": {"channels": SHAPE[0], "height": SHAPE[1], "width": SHAPE[2]},
        "sampling": {"default_samples": 2, "max_samples": 8},
        "ood": {"thresholds": {"2": {"score": "energy", "threshold": 0.5}}}, "files": {}}
    document.update(changes)
    return document


def write_version(folder: Path, module: torch.nn.Module | None = None, **changes: Any) -> Path:
    """``folder`` as a published version: ``director.ts`` (``module``, default ``TinyDirector()``) and a manifest
    (``manifest_document(**changes)``) whose ``files`` hold every file's sha256 as it is now."""
    folder.mkdir(parents=True, exist_ok=True)
    save_module(module if module is not None else TinyDirector(), folder / ARTIFACT)
    document = manifest_document(**changes)
    for path in sorted(folder.iterdir()):
        if path.is_file() and path.name != MANIFEST:
            document["files"][path.name] = {"sha256": sha256_file(path), "bytes": path.stat().st_size}
    (folder / MANIFEST).write_text(json.dumps(document))
    return folder
