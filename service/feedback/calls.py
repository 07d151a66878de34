"""The feedback store's own threads. Store calls block (SQLite waits on a lock, PostgreSQL on the network), so they
run on a small pool of their own, never on the threads inference or decoding use: a locked, full, read-only or
unreachable store then slows only ``/feedback``, never ``/predict``. Each call is bounded in time, and calls beyond
what the pool can hold waiting are refused at once; both are ``FeedbackUnavailable`` (503 with ``Retry-After``)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from service.feedback.store import FeedbackUnavailable

T = TypeVar("T")
WAITING_PER_THREAD = 4  # calls that may wait for a busy thread, per thread, before new ones are refused


class StoreCalls:
    def __init__(self, threads: int, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="feedback-store")
        self._capacity = threads * (1 + WAITING_PER_THREAD)
        self._in_flight = 0

    async def run(self, fn: Callable[..., T], *args: object, timeout_s: float | None = None) -> T:
        """``fn(*args)`` on the store's threads within ``timeout_s`` (default: the configured one). A call that
        times out keeps its thread until the store answers; it counts against the capacity until then."""
        if self._in_flight >= self._capacity:
            raise FeedbackUnavailable(f"the feedback store is not keeping up ({self._in_flight} calls waiting)")
        self._in_flight += 1
        future = asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)
        future.add_done_callback(self._done)
        limit = self.timeout_s if timeout_s is None else timeout_s
        try:
            return await asyncio.wait_for(asyncio.shield(future), limit)
        except TimeoutError as exc:
            raise FeedbackUnavailable(f"the feedback store did not answer within {limit:g} s") from exc

    def _done(self, future: asyncio.Future[object]) -> None:
        self._in_flight -= 1
        if not future.cancelled():
            future.exception()  # read, so a call that failed after its caller gave up logs no "never retrieved" error

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
