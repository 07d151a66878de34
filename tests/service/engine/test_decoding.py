"""The decode pool (``service.engine.decoding.DecodePool``): work runs on its own named threads, off the event loop,
its result or exception comes back to the awaiting coroutine, ``pending`` counts what is not done, and ``close``
finishes what was queued."""

from __future__ import annotations

import asyncio
import threading

import pytest

from service.engine.decoding import THREAD_PREFIX, DecodePool
from service.errors import ApiError, invalid
from tests.service.engine.fakes import WAIT_S


def test_work_runs_on_a_pool_thread_and_is_counted_until_done() -> None:
    pool = DecodePool(threads=2)
    release = threading.Event()

    def decode(value: int) -> tuple[int, str]:
        assert release.wait(WAIT_S)
        return value * 2, threading.current_thread().name

    async def main() -> None:
        loop_thread = threading.current_thread().name
        futures = [pool.run(decode, 1), pool.run(decode, 2)]
        assert pool.pending == 2  # counted from submission
        release.set()
        results = await asyncio.wait_for(asyncio.gather(*futures), WAIT_S)
        assert [value for value, _ in results] == [2, 4]
        assert all(name.startswith(THREAD_PREFIX) and name != loop_thread for _, name in results)
        await asyncio.sleep(0)  # the done callbacks run on the loop
        assert pool.pending == 0

    try:
        asyncio.run(main())
    finally:
        pool.close()
    assert pool.threads == 2


def test_a_bad_input_error_reaches_the_awaiting_request() -> None:
    pool = DecodePool(threads=1)

    def refuse() -> None:
        raise invalid("pixels: not an image", ["pixels"])

    async def main() -> None:
        with pytest.raises(ApiError) as error:
            await asyncio.wait_for(pool.run(refuse), WAIT_S)
        assert error.value.status == 422 and error.value.message == "pixels: not an image"
        await asyncio.sleep(0)
        assert pool.pending == 0  # a failed call is done too

    try:
        asyncio.run(main())
    finally:
        pool.close()


def test_a_cancelled_call_stops_counting() -> None:
    pool = DecodePool(threads=1)
    release = threading.Event()

    async def main() -> None:
        blocker = pool.run(release.wait, WAIT_S)  # holds the only thread
        queued = pool.run(int, "3")
        assert pool.pending == 2
        queued.cancel()  # a request whose client went away
        await asyncio.sleep(0)
        assert pool.pending == 1
        release.set()
        assert await asyncio.wait_for(blocker, WAIT_S) is True

    try:
        asyncio.run(main())
    finally:
        pool.close()


def test_close_finishes_work_submitted_without_waiting() -> None:
    pool = DecodePool(threads=1)
    release, done = threading.Event(), []
    pool.submit(lambda: done.append(release.wait(WAIT_S)))
    pool.submit(lambda: done.append("second"))
    release.set()
    pool.close()  # waits for both
    assert done == [True, "second"]
