"""A request that costs more than one batch, run one batch-sized part at a time.

Why: run whole, such a request holds its model's worker for all of its forwards, and every request queued behind it
waits for the last one. Run in parts, the worker takes one part, and puts the rest back at the end of the queue:
requests that arrived meanwhile run before the next part, so they wait for one batch, not for the whole request.
The request's own answer is the parts' results joined in order. A request with a ``seed`` is never divided: it runs
alone under its seed, so that its answer does not depend on how the budget cuts it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass, field

import torch

from service.engine.batch_cost import BatchCost
from service.engine.batching.items import BatchResult, WorkItem
from service.engine.modalities.base import BatchRunner


def inputs_per_part(cost: BatchCost, n_samples: int, longest: int) -> int:
    """The most inputs whose ``n_samples`` rows each fit one batch at the request's widest input (at least one: a
    single input over the budget is cut further by the runner's forward)."""
    return max(1, cost.budget // (n_samples * cost.width(longest)))


@dataclass
class Divided:
    """One divided request: the item as queued (its future is the request's), how many of its inputs have run and
    the results of its parts so far."""

    item: WorkItem
    done: int = 0
    parts: list[BatchResult] = field(default_factory=list)
    queued_at: float = field(default_factory=time.perf_counter)  # when the rest last went back in the queue

    @property
    def abandoned(self) -> bool:
        """The request's future is done before its last part: timed out, cancelled, or failed."""
        return self.item.future.done()

    def next_part(self, runner: BatchRunner, cost: BatchCost) -> WorkItem:
        """The next inputs that fit one batch, as a work item of their own (a fresh future)."""
        item = self.item
        stop = min(item.size, self.done + inputs_per_part(cost, item.n_samples, item.longest))
        inputs = runner.part(item.inputs, self.done, stop)
        return dataclasses.replace(item, inputs=inputs, future=asyncio.get_running_loop().create_future(),
                                   enqueued=self.queued_at)

    def add(self, part: WorkItem) -> bool:
        """Record a finished part's result; whether the request is now complete."""
        self.parts.append(part.future.result())
        self.done += part.size
        self.queued_at = time.perf_counter()
        return self.done >= self.item.size


def joined(parts: list[BatchResult]) -> BatchResult:
    """One result for a request run in parts: the per-input fields joined in order, the first part's queue wait, the
    sum of the parts' forward times, and the largest part batch's figures."""
    first = parts[0]
    kind = type(first.summary)  # the version's task's summary (``models.tasks``)
    summary = kind(**{f.name: torch.cat([getattr(p.summary, f.name) for p in parts])
                      for f in dataclasses.fields(kind)})
    scores = None if first.input_scores is None else {
        name: torch.cat([p.input_scores[name] for p in parts if p.input_scores is not None])
        for name in first.input_scores}
    widths = [p.padded_length for p in parts if p.padded_length is not None]
    return dataclasses.replace(first, summary=summary, input_scores=scores,
                               inference_s=sum(p.inference_s for p in parts),
                               batch_requests=max(p.batch_requests for p in parts),
                               batch_inputs=max(p.batch_inputs for p in parts),
                               batch_rows=max(p.batch_rows for p in parts),
                               padded_length=max(widths) if widths else None)
