"""Triton's statistics extension (``GET /v2/models[/{m}[/versions/{v}]]/stats``): for each model version, the
cumulative counts and durations of its successful and failed requests, of their wait in the queue and of the
forwards that served them, in Triton's JSON shape, so that perf_analyzer and tritonclient read them. Each server
process counts its own (with ``--workers`` > 1, ask Prometheus for the totals:
``director_model_request_duration_seconds`` and ``director_inference_duration_seconds``)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, seconds: float, count: int = 1) -> None:
        self.count += count
        self.ns += int(seconds * 1e9)

    def json(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass
class VersionStatistics:
    last_inference_ms: int = 0
    inference_count: int = 0  # inputs inferred
    execution_count: int = 0  # forwards (a forward serves a batch of requests)
    success: Duration = field(default_factory=Duration)  # end to end, per request
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)  # per request
    compute_infer: Duration = field(default_factory=Duration)  # per request: the forward that served it
    batches: dict[int, Duration] = field(default_factory=dict)  # inputs in a forward -> forwards and their time

    def forward(self, inputs: int, requests: int, seconds: float, queue_waits: list[float]) -> None:
        self.last_inference_ms = int(time.time() * 1000)
        self.inference_count += inputs
        self.execution_count += 1
        self.compute_infer.add(seconds * requests, requests)
        for wait in queue_waits:
            self.queue.add(wait)
        self.batches.setdefault(inputs, Duration()).add(seconds)

    def json(self, name: str, version: str) -> dict[str, Any]:
        def unsplit(counted: Duration) -> dict[str, int]:
            """Decoding and the summaries run outside the forward and are not split out: counted as the forwards
            are (Triton's clients require equal compute counts), with no time of their own."""
            return {"count": counted.count, "ns": 0}

        zero, forwards = Duration().json(), self.compute_infer
        return {
            "name": name, "version": version, "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count, "execution_count": self.execution_count,
            "inference_stats": {"success": self.success.json(), "fail": self.fail.json(), "queue": self.queue.json(),
                                "compute_input": unsplit(forwards), "compute_infer": forwards.json(),
                                "compute_output": unsplit(forwards), "cache_hit": zero, "cache_miss": zero},
            "batch_stats": [{"batch_size": size, "compute_input": unsplit(d), "compute_infer": d.json(),
                             "compute_output": unsplit(d)} for size, d in sorted(self.batches.items())],
            "memory_usage": [],
        }


class Statistics:
    """Every version's statistics, created on first use."""

    def __init__(self) -> None:
        self._versions: dict[tuple[str, str], VersionStatistics] = {}

    def of(self, name: str, version: str) -> VersionStatistics:
        return self._versions.setdefault((name, version), VersionStatistics())

    def report(self, versions: list[tuple[str, str]]) -> dict[str, Any]:
        return {"model_stats": [self.of(name, version).json(name, version) for name, version in versions]}
