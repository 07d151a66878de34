"""Dynamic batching for one model version: a bounded asyncio queue drained by one worker task.

The worker takes the first waiting request, then keeps packing requests until the batch reaches its budget or
``max_batch_delay_ms`` has passed since it started waiting; the forward runs in a thread so the event loop keeps
serving. The budget bounds memory by samples, not requests: image models ``max_batch_samples`` rows (inputs x
n_samples), text models ``max_batch_tokens`` padded tokens x samples (the batch's longest text rounded up to a
multiple of 8, times its rows). A request with a ``seed`` runs in a batch of its own under that seed. A full
queue refuses at once (``QueueFull``).

Slots can be reserved before a request's body is read (``reserve`` -> ``Ticket``, see ``service.admission``):
queued + held + reserved never exceeds ``max_queue``, so an admitted request is never refused later and an
overloaded model refuses before it spends anything on a request."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from models.uncertainty import UncertaintySummary
from service.artifact import Artifact
from service.device import Device
from service.inference import forward_rows, forward_token_rows, summarize_requests
from service.texts import EncodedText, padded_length

Inputs = torch.Tensor | list[EncodedText]  # pixels [n, C, H, W] float32 in [0, 1], or n tokenised texts

log = logging.getLogger("service.batching")


class QueueFull(Exception):
    """The model's queue is at ``max_queue``."""


class Draining(Exception):
    """The worker no longer accepts requests (shutdown or version retired)."""


class Ticket:
    """One queue slot reserved for a request whose body is still being read; ``enqueue`` consumes it, and
    ``release`` (idempotent) gives it back if the request ends before it is queued. It lapses at ``expires``
    (monotonic), so a client that announces a body and never sends it cannot hold a slot for ever."""

    __slots__ = ("worker", "expires", "_live")

    def __init__(self, worker: BatchWorker, expires: float) -> None:
        self.worker = worker
        self.expires = expires
        self._live = True

    @property
    def live(self) -> bool:
        return self._live

    def release(self) -> None:
        if self._live:
            self._live = False
            self.worker._reserved -= 1


@dataclass
class WorkItem:
    inputs: Inputs
    n_samples: int
    seed: int | None
    future: asyncio.Future[BatchResult]
    enqueued: float = field(default_factory=time.perf_counter)

    @property
    def size(self) -> int:
        return len(self.inputs) if isinstance(self.inputs, list) else int(self.inputs.shape[0])

    @property
    def rows(self) -> int:
        return self.size * self.n_samples

    @property
    def longest(self) -> int:
        """Tokens of the longest text (0 for images)."""
        return max((t.tokens for t in self.inputs), default=0) if isinstance(self.inputs, list) else 0


@dataclass(frozen=True)
class BatchResult:
    summary: UncertaintySummary  # fields of shape [n]
    queue_s: float
    inference_s: float
    batch_requests: int
    batch_inputs: int
    batch_rows: int
    padded_length: int | None = None  # text models: the width the batch's token ids were padded to


@dataclass(frozen=True)
class BatchStats:
    """What the metrics observe per batch."""

    requests: int
    inputs: int
    rows: int
    inference_s: float
    queue_waits: list[float]
    tokens: int | None = None  # text models: padded tokens x samples run


class BatchWorker:
    def __init__(self, artifact: Artifact, device: Device, max_batch_samples: int, max_batch_delay_ms: float,
                 max_queue: int, on_batch: Callable[[BatchStats], None] | None = None,
                 reservation_timeout_s: float = 30.0, max_batch_tokens: int = 2048) -> None:
        self.artifact = artifact
        self.device = device
        self.max_rows = max_batch_samples
        self.max_tokens = max_batch_tokens
        self.budget = max_batch_tokens if artifact.text is not None else max_batch_samples
        self.max_delay_s = max_batch_delay_ms / 1000.0
        self.queue: asyncio.Queue[WorkItem] = asyncio.Queue(maxsize=max_queue)
        self.on_batch = on_batch
        self._held: WorkItem | None = None  # taken from the queue but left for the next batch
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._busy = False
        self._reserved = 0  # live tickets
        self._tickets: deque[Ticket] = deque()  # in reservation order, so in expiry order
        self.reservation_timeout_s = reservation_timeout_s

    @property
    def max_queue(self) -> int:
        return self.queue.maxsize

    @property
    def depth(self) -> int:
        """Requests waiting for a batch."""
        return self.queue.qsize() + (1 if self._held is not None else 0)

    @property
    def pending(self) -> int:
        """Requests holding a queue slot: waiting for a batch, or admitted and still being received (tickets
        past their expiry are released first)."""
        now = time.monotonic()
        tickets = self._tickets
        while tickets and (not tickets[0].live or tickets[0].expires <= now):
            tickets.popleft().release()
        return self.depth + self._reserved

    @property
    def closed(self) -> bool:
        return self._closed

    def reserve(self) -> Ticket | None:
        """A slot for a request not yet read, or None when the queue (with its reservations) is full or closed."""
        if self._closed or self.pending >= self.max_queue:
            return None
        self._reserved += 1
        ticket = Ticket(self, time.monotonic() + self.reservation_timeout_s)
        self._tickets.append(ticket)
        return ticket

    @property
    def idle(self) -> bool:
        return self.depth == 0 and not self._busy

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="batch-worker")

    def cost(self, rows: int, longest: int) -> int:
        """What a batch of ``rows`` sampled rows counts against the budget: rows (images), or rows x the padded width
        of its longest text (texts)."""
        if self.artifact.text is None:
            return rows
        return rows * padded_length(longest, self.artifact.text.max_length)

    def enqueue(self, inputs: Inputs, n_samples: int, seed: int | None, ticket: Ticket | None = None
                ) -> asyncio.Future[BatchResult]:
        """Queue one request at once or raise; await the future for its result (cancel it to abandon it).

        A live ``ticket`` of this worker turns into the queued item (its slot was counted already); a ticket of
        another worker (the request named another model, or the version was swapped) is released."""
        if self._closed:
            raise Draining("model version is shutting down")
        if ticket is not None and ticket.worker is self and ticket.live:
            ticket.release()  # the slot passes to the item queued below, with no await in between
        else:
            if ticket is not None:
                ticket.release()
            if self.pending >= self.max_queue:
                raise QueueFull(f"queue full ({self.max_queue} requests queued or being received)")
        if isinstance(inputs, list) != (self.artifact.text is not None):
            raise TypeError("text inputs for a text model, pixels for an image model")
        item = WorkItem(inputs, n_samples, seed, asyncio.get_running_loop().create_future())
        try:
            self.queue.put_nowait(item)  # does not overflow: queued + held + reserved <= max_queue
        except asyncio.QueueFull as exc:  # defensive: the accounting above is the real bound
            raise QueueFull(f"queue full ({self.max_queue} requests queued)") from exc
        return item.future

    async def close(self, timeout_s: float) -> None:
        """Refuse new requests, finish the queued ones (up to ``timeout_s``), then stop."""
        self._closed = True
        deadline = time.monotonic() + timeout_s
        while not self.idle and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for item in self._drain_left():
            if not item.future.done():
                item.future.set_exception(Draining("model version shut down before the request ran"))

    def _drain_left(self) -> list[WorkItem]:
        left = [self._held] if self._held is not None else []
        self._held = None
        while not self.queue.empty():
            left.append(self.queue.get_nowait())
        return left

    async def _next(self) -> WorkItem:
        if self._held is not None:
            item, self._held = self._held, None
            return item
        return await self.queue.get()

    async def _collect(self) -> list[WorkItem]:
        first = await self._next()
        self._busy = True
        if first.seed is not None:
            return [first]
        batch, rows, longest = [first], first.rows, first.longest
        deadline = time.perf_counter() + self.max_delay_s
        while self.cost(rows, longest) < self.budget:
            remaining = deadline - time.perf_counter()
            try:
                item = self.queue.get_nowait() if remaining <= 0 else await asyncio.wait_for(self.queue.get(),
                                                                                             remaining)
            except (TimeoutError, asyncio.QueueEmpty):
                break
            if item.seed is not None or self.cost(rows + item.rows, max(longest, item.longest)) > self.budget:
                self._held = item  # starts the next batch
                break
            batch.append(item)
            rows, longest = rows + item.rows, max(longest, item.longest)
        return batch

    async def _run(self) -> None:
        while True:
            batch = await self._collect()
            try:
                live = [item for item in batch if not item.future.done()]  # timed-out requests are skipped
                if live:
                    await self._process(live)
            except Exception as exc:  # report to the waiting requests; keep the worker alive
                log.exception("batch of %d requests failed", len(batch))
                for item in batch:
                    if not item.future.done():
                        item.future.set_exception(exc)
            finally:
                self._busy = False

    async def _process(self, batch: list[WorkItem]) -> None:
        started = time.perf_counter()
        sizes = [item.size for item in batch]
        samples = [item.n_samples for item in batch]
        repeats = [s for size, s in zip(sizes, samples, strict=True) for _ in range(size)]
        seed = batch[0].seed if len(batch) == 1 else None
        summaries, tokens = await asyncio.to_thread(self._infer, batch, repeats, sizes, samples, seed)
        inference_s = time.perf_counter() - started
        waits = [started - item.enqueued for item in batch]
        width = None
        if self.artifact.text is not None:
            width = padded_length(max(item.longest for item in batch), self.artifact.text.max_length)
        for item, summary, wait in zip(batch, summaries, waits, strict=True):
            if not item.future.done():
                item.future.set_result(BatchResult(summary, wait, inference_s, len(batch), sum(sizes),
                                                   sum(repeats), width))
        if self.on_batch is not None:
            self.on_batch(BatchStats(len(batch), sum(sizes), sum(repeats), inference_s, waits, tokens))

    def _infer(self, batch: list[WorkItem], repeats: list[int], sizes: list[int], samples: list[int],
               seed: int | None) -> tuple[list[UncertaintySummary], int | None]:
        tokens = None
        if self.artifact.text is not None:
            ids = [text.ids for item in batch if isinstance(item.inputs, list) for text in item.inputs]
            rows, tokens = forward_token_rows(self.artifact, self.device, ids, repeats, self.max_tokens, seed)
        else:
            images = [item.inputs for item in batch if isinstance(item.inputs, torch.Tensor)]
            pixels = torch.cat(images)  # [sum(n), C, H, W]
            rows = forward_rows(self.artifact, self.device, pixels, repeats, self.max_rows, seed)
        return summarize_requests(rows, sizes, samples, self.artifact.temperature), tokens
