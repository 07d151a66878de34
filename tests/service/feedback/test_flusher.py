"""The prediction log's writer stops when closed even when a flush swallows the cancel: on Python 3.11
``asyncio.wait_for`` returns a result that arrives with a cancel instead of raising it, which left the flusher
looping and the server's shutdown (and the batch scorer's exit) waiting on it forever."""

from __future__ import annotations

import asyncio
from typing import Any

from service.feedback.flusher import LogFlusher
from tests.waiting import until


class Store:
    """Always something pending; counts what the flusher asks of it."""

    pending = True

    def __init__(self) -> None:
        self.flushes = 0
        self.closed = False

    def flush(self) -> None:
        self.flushes += 1

    def close(self) -> None:
        self.closed = True


class SwallowingCalls:
    """Store calls whose run answers although it was cancelled while it waited (the first time), as wait_for can."""

    def __init__(self) -> None:
        self.waiting = False
        self.swallowed = 0
        self.closed = False

    async def run(self, fn: Any, *args: Any, timeout_s: float | None = None) -> Any:
        self.waiting = True
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            if self.swallowed:  # a later cancel goes through (it ends the test's loop if close hung)
                raise
            self.swallowed += 1  # the first cancel is lost here
        finally:
            self.waiting = False
        return fn(*args)

    def close(self) -> None:
        self.closed = True


def test_close_ends_the_flusher_even_when_a_flush_swallows_the_cancel() -> None:
    async def scenario() -> tuple[Store, SwallowingCalls]:
        store, calls = Store(), SwallowingCalls()
        flusher = LogFlusher(store, calls, interval_s=0.001)  # type: ignore[arg-type]
        flusher.start()
        await until(lambda: calls.waiting, "a flush in flight")
        closing = asyncio.create_task(flusher.close())
        done, _ = await asyncio.wait({closing}, timeout=10)  # a hang becomes a failure (wait cancels nothing)
        assert closing in done, "close did not end the flusher"
        return store, calls

    store, calls = asyncio.run(scenario())
    assert calls.swallowed == 1 and store.flushes == 1  # the cancel met the flush and was lost there
    assert store.closed and calls.closed  # and close still ended the loop and released the store
