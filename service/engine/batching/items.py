"""What the batch worker queues (``WorkItem``), what a request gets back (``BatchResult``) and what the metrics
observe per batch (``BatchStats``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from models.uncertainty import UncertaintySummary
from service.engine.modalities.base import InputBatch


@dataclass
class WorkItem:
    inputs: InputBatch
    n_samples: int
    seed: int | None
    future: asyncio.Future[BatchResult]
    enqueued: float = field(default_factory=time.perf_counter)
    units_per_input: int = 0  # the batch cost of one of its inputs, at the whole request's widest (set when queued)

    @property
    def units(self) -> int:
        """Its inputs' share of the worker's queued work (a divided request's parts keep the request's width, so the
        parts' units add up to the request's)."""
        return self.size * self.units_per_input

    @property
    def size(self) -> int:
        return self.inputs.size

    @property
    def rows(self) -> int:
        return self.size * self.n_samples

    @property
    def longest(self) -> int:
        """The widest input's width, as the model's runner measures it (``InputBatch.longest``)."""
        return self.inputs.longest


@dataclass(frozen=True)
class BatchResult:
    summary: UncertaintySummary  # fields of shape [n]
    # scored_rows' per-input scores by name ([n] each), named once per batch (``Artifact.named_scores``) and read by
    # both the temperature and the OOD rule; None when the manifest reads none
    input_scores: Mapping[str, torch.Tensor] | None
    queue_s: float
    inference_s: float
    batch_requests: int
    batch_inputs: int
    batch_rows: int
    padded_length: int | None = None  # inputs with a width (texts): the width the batch was padded to


@dataclass(frozen=True)
class BatchStats:
    """What the metrics observe per batch."""

    requests: int
    inputs: int
    rows: int
    inference_s: float
    queue_waits: list[float]
    tokens: int | None = None  # text models: padded tokens x samples run
