"""Small fakes for the engine's unit tests: a real ``Artifact`` around a fake module whose logits and per-input
scores are known from its inputs, whose forwards are recorded and can be held on an event, and which counts how often
its per-input scores are named. No TorchScript, no server: every test here runs in the test's own process."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from artifact.contract import FORMAT_VERSION, Manifest
from service.engine.artifact import Artifact, validate_manifest
from service.engine.batching import BatchStats, BatchWorker
from service.engine.device import Device
from service.engine.modalities.image import ImageBatch, ImageDecoder, ImageRunner

SHAPE = (1, 2, 2)  # (channels, height, width) of the fake image model
LABELS = ["a", "b"]
WAIT_S = 10.0  # bound of every wait: it only turns a hang into a failure


def manifest(ood_score: str = "energy", input_scores: list[str] | None = None,
             temperature_by: str | None = None) -> Manifest:
    """A valid image manifest of ``SHAPE`` and ``LABELS`` whose OOD rule (threshold 0.5 at S = 2) uses
    ``ood_score``; ``input_scores``: the columns of ``scored_rows``; ``temperature_by``: a per-input score the
    temperature follows (slope 1, term unscaled: ``exp(max(0, score))``)."""
    document: dict[str, Any] = {
        "format_version": FORMAT_VERSION, "name": "fake", "version": "1", "modality": "image", "labels": LABELS,
        "input": {"channels": SHAPE[0], "height": SHAPE[1], "width": SHAPE[2]},
        "sampling": {"default_samples": 2, "max_samples": 8},
        "ood": {"thresholds": {"2": {"score": ood_score, "threshold": 0.5}}},
        "files": {"director.ts": {"sha256": "0" * 64}}}
    if input_scores is not None:
        document["artifact"] = {"input_scores": input_scores}
    if temperature_by is not None:
        document["temperature_by_score"] = {"slope": 1.0, "terms": [
            {"score": temperature_by, "weight": 1.0, "center": 0.0, "scale": 1.0}]}
    return validate_manifest(document)


class FakeModule:
    """Each input is an image filled with one value v: each of its rows is the logits ``[v, -v]`` and its per-input
    scores are ``(v, 2v)``. Records the values of every forward, in order, before it waits for ``release`` (set:
    forwards run at once; clear it to hold them), and raises ``fail`` when one is set."""

    def __init__(self) -> None:
        self.forwards: list[list[float]] = []
        self.release = threading.Event()
        self.release.set()
        self.fail: Exception | None = None

    def sample_rows(self, pixels: torch.Tensor, repeats: torch.Tensor) -> torch.Tensor:
        values = pixels.flatten(1)[:, 0]  # [B]
        self.forwards.append([round(v, 6) for v in values.tolist()])
        assert self.release.wait(WAIT_S), "the test never released the forward"
        if self.fail is not None:
            raise self.fail
        return torch.stack([values, -values], 1).repeat_interleave(repeats, 0)  # [sum(repeats), 2]

    def scored_rows(self, pixels: torch.Tensor, repeats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        values = pixels.flatten(1)[:, 0]  # [B]
        return self.sample_rows(pixels, repeats), torch.stack([values, 2 * values], 1)  # [S*B, 2], [B, 2]


@dataclass
class CountingArtifact(Artifact):
    """The real artifact, counting how often it names a batch's per-input scores."""

    named_calls: int = 0

    def named_scores(self, scores: torch.Tensor | None) -> dict[str, torch.Tensor] | None:
        self.named_calls += 1
        return super().named_scores(scores)


def fake_artifact(module: FakeModule | None = None, **manifest_options: Any) -> CountingArtifact:
    return CountingArtifact(Path("."), manifest(**manifest_options), module or FakeModule(),  # type: ignore[arg-type]
                            ImageDecoder(SHAPE), ImageRunner(SHAPE))


def images(*values: float) -> ImageBatch:
    """Decoded inputs, one image filled with each value."""
    return ImageBatch(torch.tensor(values).view(-1, 1, 1, 1).expand(-1, *SHAPE).contiguous())  # [n, C, H, W]


def pixels(value: float) -> list[list[list[float]]]:
    """One input as a JSON request's ``pixels``."""
    return [[[value] * SHAPE[2] for _ in range(SHAPE[1])] for _ in range(SHAPE[0])]


def worker(artifact: Artifact, max_batch_samples: int = 4, max_batch_delay_ms: float = 0.0, max_queue: int = 8,
           on_batch: Callable[[BatchStats], None] | None = None, request_timeout_s: float | None = None,
           reservation_timeout_s: float = 30.0) -> BatchWorker:
    """A batch worker on the CPU. No batch delay by default: a batch takes what is queued when it starts (requests
    queued in one step of the event loop share it), so no test waits on a clock."""
    return BatchWorker(artifact, Device(torch.device("cpu")), max_batch_samples, max_batch_delay_ms, max_queue,
                       on_batch, reservation_timeout_s=reservation_timeout_s, request_timeout_s=request_timeout_s)


def first_probability(value: float, temperature: float = 1.0) -> float:
    """What the fake's summary gives as the probability of label ``a`` for an input of ``value``."""
    return float(torch.softmax(torch.tensor([value, -value]) / temperature, 0)[0])


