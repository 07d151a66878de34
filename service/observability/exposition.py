"""The ``/metrics`` body, made at most once per ``max_age_s`` however many scrapers ask, and off the event loop.

Writing the text format walks every series of the registry: tens of milliseconds with a few model versions served,
all of it CPU. Made on the event loop for each scrape, an open ``/metrics`` flood (eight scrapers back to back) keeps
the loop busy enough to hold every prediction behind it for a second. So one body is made at a time, in a thread
(concurrent scrapes wait for it and share it), and it is served again to every scrape within ``max_age_s`` of being
made: a flood then costs one body per ``max_age_s``, however fast it scrapes. Prometheus scrapes every few seconds,
so a body a second old shows it nothing stale; ``0`` makes a body for each scrape (still one at a time)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


class Exposition:
    def __init__(self, make: Callable[[], bytes], max_age_s: float, clock: Callable[[], float] = time.monotonic
                 ) -> None:
        self._make, self.max_age_s, self._clock = make, max_age_s, clock
        self._body: bytes | None = None
        self._made_at = 0.0
        self._lock = asyncio.Lock()

    async def body(self) -> bytes:
        asked_at = self._clock()
        async with self._lock:  # one body at a time; scrapes that arrive meanwhile take the one made for them
            fresh = self._body is not None and (self._made_at >= asked_at
                                                or asked_at - self._made_at < self.max_age_s)
            if not fresh:
                started = self._clock()
                self._body = await asyncio.to_thread(self._make)
                self._made_at = started
            assert self._body is not None
            return self._body
