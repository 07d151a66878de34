"""The batch worker of one model version: a bounded asyncio queue drained by one task.

The worker takes the first waiting request, then keeps packing requests until the batch's cost reaches its budget
(``service.engine.batch_cost``, as the model's batch runner measures it) or ``max_batch_delay_ms`` has passed since
it started waiting; the forward runs in a thread so the event loop keeps serving, and its rows are split back per
request. A request with a ``seed`` runs in a batch of its own under that seed. A request that costs more than one
batch runs one batch-sized part at a time, the rest going back to the end of the queue between parts, so requests
queued behind it interleave (``service.engine.batching.divided``). A full queue refuses at once (``QueueFull``,
``service.engine.batching.slots``), and so does a queue whose work would not finish within the request timeout
(``OverBudget``): the worker measures its seconds per unit of batch cost on every forward, and refuses a request when
the queued work and its own would take more than ``ADMIT_FRACTION`` of the timeout. Without it, twenty costly requests
admitted together ran part by part, interleaved, all finished late and were all answered 504: every forward wasted.
The rate can slow after admission (the decoding of requests still arriving, other work on the machine), so before
each batch the worker also refuses the newest live request (``OverBudget``, 503) while an older one would end past its
deadline at the current rate and would not without the newer ones: interleaved parts of equal requests finish
together, so one request too many would make every one of them late."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import torch

from models.uncertainty import UncertaintySummary, temperature_for
from service.engine.artifact import Artifact
from service.engine.batching.divided import Divided, joined
from service.engine.batching.items import BatchResult, BatchStats, WorkItem
from service.engine.batching.slots import QueueFull, Slots, Ticket
from service.engine.device import Device
from service.engine.inference import split_scores, summarize_requests
from service.engine.modalities.base import Forward, InputBatch

log = logging.getLogger("service.engine.batching")
ADMIT_FRACTION = 0.8  # of the request timeout the queued work may fill: the estimate's margin
RATE_SMOOTHING = 0.3  # weight of the newest forward in the seconds-per-unit estimate


class OverBudget(QueueFull):
    """The queued work would not finish within the request timeout: refused now (503) rather than answered 504."""


def _finish(remaining: list[int], i: int, among: int) -> int:
    """Units of work until request ``i`` ends when the first ``among`` live requests' parts interleave: its own
    remaining units and, of each other, at most as many."""
    return sum(min(units, remaining[i]) for units in remaining[:among])


class Draining(Exception):
    """The worker no longer accepts requests (shutdown or version retired)."""


class BatchWorker:
    def __init__(self, artifact: Artifact, device: Device, max_batch_samples: int, max_batch_delay_ms: float,
                 max_queue: int, on_batch: Callable[[BatchStats], None] | None = None,
                 reservation_timeout_s: float = 30.0, max_batch_tokens: int = 2048, instances: int = 1,
                 request_timeout_s: float | None = None) -> None:
        self.artifact = artifact
        self.temperature = artifact.temperature  # of every sampled logit row, or per input (fixed per artifact)
        self.device = device
        self.batch_cost = artifact.runner.batch_cost(max_batch_samples, max_batch_tokens)
        self.max_delay_s = max_batch_delay_ms / 1000.0
        # unbounded: the slots are the bound (a divided request's rest goes back in while its part runs)
        self.queue: asyncio.Queue[WorkItem | Divided] = asyncio.Queue()
        self._max_queue = max_queue
        self.slots = Slots(max_queue, reservation_timeout_s)
        self.on_batch = on_batch
        self._held: WorkItem | Divided | None = None  # taken from the queue but left for the next batch
        self._running_parts = 0  # divided requests whose part is in a forward (they keep their queue slot)
        self.instances = instances  # tasks draining the queue, each running its own batches' forwards
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False
        self._busy = 0  # tasks between taking a batch's first request and finishing its forward
        self.request_timeout_s = request_timeout_s  # None: no admission by work
        self.queued_units = 0  # batch cost of every input queued or running, by ``WorkItem.units``
        self.seconds_per_unit: float | None = None  # measured on every forward; None before the first one
        self._admitted: list[WorkItem] = []  # queued requests in admission order (done ones pruned before a batch)
        self._progress: dict[int, Divided] = {}  # a divided request's progress, by its future's id

    @property
    def max_queue(self) -> int:
        return self._max_queue

    @property
    def depth(self) -> int:
        """Requests waiting for a batch (a divided request counts until its last part has run)."""
        return self.queue.qsize() + (1 if self._held is not None else 0) + self._running_parts

    @property
    def pending(self) -> int:
        """Requests holding a queue slot: waiting for a batch, or admitted and still being received."""
        return self.slots.pending(self.depth)

    @property
    def closed(self) -> bool:
        return self._closed

    def reserve(self) -> Ticket | None:
        """A slot for a request not yet read, or None when the queue (with its reservations) is full or closed."""
        return None if self._closed else self.slots.reserve(self.depth)

    @property
    def idle(self) -> bool:
        return self.depth == 0 and self._busy == 0

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._run(), name=f"batch-worker-{i}") for i in range(self.instances)]

    def enqueue(self, inputs: InputBatch, n_samples: int, seed: int | None, ticket: Ticket | None = None
                ) -> asyncio.Future[BatchResult]:
        """Queue one request at once or raise; await the future for its result (cancel it to abandon it). A live
        ``ticket`` of this worker's slots turns into the queued item (its slot was counted already)."""
        if self._closed:
            raise Draining("model version is shutting down")
        self.slots.take(ticket, self.depth)
        if not isinstance(inputs, InputBatch):
            raise TypeError("inputs must be decoded by the model's decoder (an InputBatch)")
        item = WorkItem(inputs, n_samples, seed, asyncio.get_running_loop().create_future(),
                        units_per_input=n_samples * self.batch_cost.width(inputs.longest))
        self._admit(item.units)
        self.queue.put_nowait(item)  # queued + held + reserved <= max_queue: the slots counted it
        self.queued_units += item.units
        self._admitted.append(item)
        return item.future

    def estimated_wait_s(self, units: int = 0) -> float | None:
        """Seconds the queued work (and ``units`` more) would take at the measured rate; None before a forward."""
        if self.seconds_per_unit is None:
            return None
        return (self.queued_units + units) * self.seconds_per_unit / self.instances

    def _admit(self, units: int) -> None:
        """``OverBudget`` when the queue is busy and its work with these ``units`` would not fit the timeout (a
        request alone is always admitted: the per-request cost bound is the route's)."""
        wait = self.estimated_wait_s(units)
        if wait is None or self.request_timeout_s is None or self.queued_units == 0:
            return
        if wait > ADMIT_FRACTION * self.request_timeout_s:
            raise OverBudget(f"about {wait:.1f}s of work is queued, more than its {self.request_timeout_s:g}s "
                             f"request timeout allows")

    def _remaining_units(self, request: WorkItem) -> int:
        """A live request's work not yet run: a divided request's inputs after its finished parts."""
        divided = self._progress.get(id(request.future))
        return request.units - (divided.done * request.units_per_input if divided is not None else 0)

    def _shed_late(self) -> None:
        """Refuse the newest live request (``OverBudget``) while an older one would end past its deadline at the
        measured rate but would not if no request newer than it were queued. Parts interleave, so a request ends after
        its own remaining work plus, of every other live request, at most as much as its own (``_finish``). A request
        late even without the newer ones is not helped by refusing them, and the oldest is never refused here."""
        live = [request for request in self._admitted if not request.future.done()]  # admission order
        self._admitted = live
        self._progress = {key: d for key, d in self._progress.items() if not d.item.future.done()}
        if self.request_timeout_s is None or self.seconds_per_unit is None or len(live) < 2:
            return
        now, per_unit = time.perf_counter(), self.seconds_per_unit / self.instances
        remaining = [self._remaining_units(request) for request in live]
        if now + per_unit * sum(remaining) <= live[0].enqueued + self.request_timeout_s:
            return  # everything ends before the earliest deadline: nobody is late (the usual case, one pass)
        while len(live) > 1:
            deadlines = [request.enqueued + self.request_timeout_s for request in live]
            savable = [i for i in range(len(live) - 1)
                       if now + per_unit * _finish(remaining, i, len(live)) > deadlines[i]
                       and now + per_unit * _finish(remaining, i, i + 1) <= deadlines[i]]
            if not savable:
                return
            late = now + per_unit * _finish(remaining, savable[0], len(live)) - deadlines[savable[0]]
            newest = live.pop()
            remaining.pop()
            newest.future.set_exception(OverBudget(
                f"the queued work now runs slower than when it was admitted: with it an older request would end about "
                f"{late:.1f}s late, more than its {self.request_timeout_s:g}s request timeout allows"))

    async def close(self, timeout_s: float) -> None:
        """Refuse new requests, finish the queued ones (up to ``timeout_s``), then stop."""
        self._closed = True
        deadline = time.monotonic() + timeout_s
        while not self.idle and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for left in self._drain_left():
            item = left.item if isinstance(left, Divided) else left
            if not item.future.done():
                item.future.set_exception(Draining("model version shut down before the request ran"))

    def _drain_left(self) -> list[WorkItem | Divided]:
        left = [self._held] if self._held is not None else []
        self._held = None
        while not self.queue.empty():
            left.append(self.queue.get_nowait())
        return left

    async def _next(self) -> WorkItem | Divided:
        if self._held is not None:
            item, self._held = self._held, None
            return item
        return await self.queue.get()

    def _divides(self, item: WorkItem | Divided) -> bool:
        """Whether ``item`` runs in parts: a divided request's rest, or a request without a seed over one batch."""
        return isinstance(item, Divided) or (item.seed is None and not self.batch_cost.fits(item.rows, item.longest))

    async def _collect(self) -> tuple[list[WorkItem], Divided | None]:
        """The next batch, and the divided request it is a part of (None for a batch of whole requests)."""
        first = await self._next()
        self._busy += 1
        if self._divides(first):
            divided = first if isinstance(first, Divided) else Divided(first, queued_at=first.enqueued)
            self._progress[id(divided.item.future)] = divided
            self._running_parts += 1
            return [divided.next_part(self.artifact.runner, self.batch_cost)], divided
        assert isinstance(first, WorkItem)
        if first.seed is not None:
            return [first], None
        batch, rows, longest = [first], first.rows, first.longest
        deadline = time.perf_counter() + self.max_delay_s
        while not self.batch_cost.full(rows, longest):
            remaining = deadline - time.perf_counter()
            try:
                if remaining <= 0:
                    item = self.queue.get_nowait()
                else:  # not wait_for, which can swallow the close's cancel when an item arrives with it (3.11)
                    async with asyncio.timeout(remaining):
                        item = await self.queue.get()
            except (TimeoutError, asyncio.QueueEmpty):
                break
            if (isinstance(item, Divided) or item.seed is not None
                    or not self.batch_cost.fits(rows + item.rows, max(longest, item.longest))):
                self._held = item  # starts the next batch
                break
            batch.append(item)
            rows, longest = rows + item.rows, max(longest, item.longest)
        return batch, None

    async def _run(self) -> None:
        while True:
            batch, divided = await self._collect()
            try:
                self._shed_late()
                live = [item for item in batch if not item.future.done()]  # timed-out requests are skipped
                if live and not (divided is not None and divided.abandoned):
                    await self._process(live)
            except Exception as exc:  # report to the waiting requests; keep the worker alive
                log.exception("batch of %d requests failed", len(batch))
                for item in batch:
                    if not item.future.done():
                        item.future.set_exception(exc)
            finally:
                self._busy -= 1
                self.queued_units -= sum(item.units for item in batch)
                if divided is not None:
                    self._running_parts -= 1
                    self._after_part(divided, batch[0])

    def _after_part(self, divided: Divided, part: WorkItem) -> None:
        """A divided request's part has run: its failure is the request's, its last part completes the request, and
        otherwise the rest goes back to the end of the queue. A request that ends before its rest ran takes the
        rest's units off the queued work."""
        request = divided.item.future
        rest = divided.item.units - divided.done * divided.item.units_per_input - part.units  # after this part
        if request.done():  # timed out, cancelled or the client gone: the rest never runs
            self.queued_units -= rest
            return
        if not part.future.done() or part.future.cancelled():
            request.set_exception(Draining("the request's part did not run"))
            self.queued_units -= rest
        elif part.future.exception() is not None:
            request.set_exception(part.future.exception())  # type: ignore[arg-type]
            self.queued_units -= rest
        elif divided.add(part):
            request.set_result(joined(divided.parts))
        else:
            self.queue.put_nowait(divided)

    async def _process(self, batch: list[WorkItem]) -> None:
        """One forward for the batch, its rows split back into each request's future."""
        started = time.perf_counter()
        sizes = [item.size for item in batch]
        samples = [item.n_samples for item in batch]
        repeats = [s for size, s in zip(sizes, samples, strict=True) for _ in range(size)]
        seed = batch[0].seed if len(batch) == 1 else None
        forward, summaries, scores_of = await asyncio.to_thread(self.infer, [item.inputs for item in batch], repeats,
                                                                sizes, samples, seed)
        inference_s = time.perf_counter() - started
        self._measure(inference_s, sum(item.units for item in batch))
        waits = [started - item.enqueued for item in batch]
        for item, summary, scores, wait in zip(batch, summaries, scores_of, waits, strict=True):
            if not item.future.done():
                item.future.set_result(BatchResult(summary, scores, wait, inference_s, len(batch), sum(sizes),
                                                   sum(repeats), forward.padded_length))
        if self.on_batch is not None:
            self.on_batch(BatchStats(len(batch), sum(sizes), sum(repeats), inference_s, waits, forward.tokens))

    def _measure(self, seconds: float, units: int) -> None:
        rate = seconds / max(units, 1)
        old = self.seconds_per_unit
        self.seconds_per_unit = rate if old is None else (1 - RATE_SMOOTHING) * old + RATE_SMOOTHING * rate

    def infer(self, requests: list[InputBatch], repeats: list[int], sizes: list[int], samples: list[int],
              seed: int | None) -> tuple[Forward, list[UncertaintySummary], list[dict[str, torch.Tensor] | None]]:
        """The batch's forwards, then each request's summary and per-input scores (in the forward's thread; the
        offline scorer calls it directly, ``service.scoring``). The scores are named once here, for the whole batch:
        the temperature reads them now and the predictor's OOD rule reads each request's share later."""
        runner = self.artifact.runner
        inputs = runner.join(requests)
        forward = runner.forward(self.artifact.rows, self.device, inputs, repeats, self.batch_cost, seed)
        named = self.artifact.named_scores(forward.scores)  # {name: [n]} or None
        temperature = temperature_for(self.temperature, named)  # float or [n]
        summaries = summarize_requests(forward.rows, sizes, samples, temperature, self.artifact.task.summarize)
        return forward, summaries, split_scores(named, sizes)
