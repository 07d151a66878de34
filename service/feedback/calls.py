"""The feedback store's own threads. Store calls block (SQLite waits on a lock, PostgreSQL on the network), so they
run on a small pool of their own, never on the threads inference or decoding use: a locked, full, read-only or
unreachable store then slows only ``/feedback``, never ``/predict``. Each call is bounded in time, and calls beyond
what the pool can hold waiting are refused at once; both are ``FeedbackUnavailable`` (503 with ``Retry-After``).

A store that has just failed is not asked again by every caller: for ``retry_s`` after a failure, calls are refused
at once without reaching a thread, then a single call tries the store (the prediction log's next flush, usually)
while the others are still refused; its success lets every call through again. Without this, each ``/feedback``
during an outage would try to write the whole pending prediction log (SQLite does so before every read) and fail
again, costing the server's CPU for an answer known in advance."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from service.feedback.store import FeedbackUnavailable

T = TypeVar("T")
WAITING_PER_THREAD = 4  # calls that may wait for a busy thread, per thread, before new ones are refused
RETRY_S = 1.0  # after a store failure: how long calls are refused at once before one tries the store again


class StoreCalls:
    def __init__(self, threads: int, timeout_s: float, retry_s: float = RETRY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout_s = timeout_s
        self.retry_s = retry_s
        self._clock = clock
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="feedback-store")
        self._capacity = threads * (1 + WAITING_PER_THREAD)
        self._in_flight = 0
        self._failed_at: float | None = None  # the last failure, while no call has succeeded since
        self._failure = ""
        self._trying = False  # the one call let through to try a store that failed

    @property
    def failing(self) -> bool:
        """Whether the last call that reached the store failed (calls are being refused or retried)."""
        return self._failed_at is not None

    async def run(self, fn: Callable[..., T], *args: object, timeout_s: float | None = None) -> T:
        """``fn(*args)`` on the store's threads within ``timeout_s`` (default: the configured one). A call that
        times out keeps its thread until the store answers; it counts against the capacity until then."""
        if self._in_flight >= self._capacity:
            raise FeedbackUnavailable(f"the feedback store is not keeping up ({self._in_flight} calls waiting)")
        trial = self._admit()
        self._in_flight += 1
        future = asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)
        future.add_done_callback(self._done)
        limit = self.timeout_s if timeout_s is None else timeout_s
        try:
            async with asyncio.timeout(limit):  # not wait_for: on 3.11 it can swallow a cancel that meets a result
                result = await asyncio.shield(future)
        except TimeoutError as exc:
            message = f"the feedback store did not answer within {limit:g} s"
            self._failed(message)
            raise FeedbackUnavailable(message) from exc
        except FeedbackUnavailable as exc:
            self._failed(str(exc))
            raise
        finally:
            if trial:
                self._trying = False
        self._failed_at = None
        return result

    def _admit(self) -> bool:
        """Refuse at once while the store is known to be failing; let one call through every ``retry_s``. Whether
        this call is that one."""
        if self._failed_at is None:
            return False
        since = self._clock() - self._failed_at
        if self._trying or since < self.retry_s:
            raise FeedbackUnavailable(f"the feedback store failed {since:.1f} s ago ({self._failure}); "
                                      f"it is tried again every {self.retry_s:g} s")
        self._trying = True
        return True

    def _failed(self, message: str) -> None:
        self._failed_at, self._failure = self._clock(), message

    def _done(self, future: asyncio.Future[object]) -> None:
        self._in_flight -= 1
        if not future.cancelled():
            future.exception()  # read, so a call that failed after its caller gave up logs no "never retrieved" error

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
