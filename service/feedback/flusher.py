"""The prediction log's writer: every ``FLUSH_INTERVAL_S`` it writes what ``FeedbackStore.log`` gathered, in one
transaction on the store's own threads (``StoreCalls``), and on ``close`` it writes what is left and releases the
store and its threads. A failing store is reported once per outage; the rows wait for the next flush."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from service.feedback.calls import StoreCalls
from service.feedback.store import FLUSH_INTERVAL_S, FeedbackStore

log = logging.getLogger("service.feedback")
FLUSH_TIMEOUT_S = 30.0  # one flush of the prediction log (it goes on in its thread past this; the next one waits)


class LogFlusher:
    def __init__(self, store: FeedbackStore, calls: StoreCalls, interval_s: float = FLUSH_INTERVAL_S) -> None:
        self.store = store
        self.calls = calls
        self.interval_s = interval_s
        self._task: asyncio.Task[None] | None = None
        self._closing = False  # the loop's own stop: a cancel alone can be swallowed by what a flush awaits

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="feedback-flush")

    async def _run(self) -> None:
        failing = False
        while not self._closing:
            await asyncio.sleep(self.interval_s)
            if not self.store.pending:
                continue
            try:
                await self.calls.run(self.store.flush, timeout_s=FLUSH_TIMEOUT_S)
            except Exception:  # the next flush retries what is still pending; predictions go on
                if not failing:
                    log.exception("could not write the prediction log; retrying")
                failing = True
            else:
                if failing:
                    log.info("the prediction log is written again")
                failing = False

    async def close(self) -> None:
        """Stop flushing, write what is still pending, release the store and its threads."""
        self._closing = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await asyncio.to_thread(self.store.close)  # a locked or unreachable store must not hold the event loop
        self.calls.close()
