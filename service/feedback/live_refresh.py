"""The live gauges' schedule: every ``interval_s`` one task reads the live windows from the feedback store (on the
store's own threads) and sets the gauges. A scrape of ``/metrics`` only reads the gauges, so it costs the same at 100
labelled rows and at 100,000, and any number of scrapers never reach the store. The read also probes a store that
failed: once it answers again, ``director_feedback_store_up`` and ``/feedback`` recover without waiting for traffic."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger("service.feedback")


class LiveRefresher:
    def __init__(self, refresh: Callable[[], Awaitable[None]], interval_s: float) -> None:
        self.refresh = refresh
        self.interval_s = interval_s
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="live-gauges")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.refresh()
            except Exception:  # a refresh that failed in an unforeseen way must not end the schedule
                log.exception("could not refresh the live gauges; trying again in %g s", self.interval_s)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
