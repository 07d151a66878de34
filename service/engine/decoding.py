"""The decode pool: a few threads that turn request inputs into tensors (base64 and image decoding, resizing, nested
JSON lists to arrays, OIP request parsing, tokenizing), so the event loop never does that work itself.

Why: on the event loop one large request (256 PNGs under the pixel limit) held every other connection for seconds,
``/health/live`` included, long enough to fail a liveness probe. In the pool it waits for a thread instead, and the
loop keeps reading sockets and answering probes. Pillow and the tokenizers release the GIL while they decode.

Bounded: ``DIRECTOR_DECODE_THREADS`` threads; the work waiting for them is bounded by admission (a prediction holds a
queue slot while its inputs are prepared, so at most ``DIRECTOR_MAX_QUEUE`` per model version wait) and the work of
each by ``DIRECTOR_MAX_REQUEST_PIXELS`` (``service.engine.images.PixelBudget``) and the body limit."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
THREAD_PREFIX = "director-decode"


class DecodePool:
    def __init__(self, threads: int) -> None:
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix=THREAD_PREFIX)
        self.threads = threads
        self.pending = 0  # calls submitted and not finished (read and written on the event loop only)

    def run(self, work: Callable[..., T], *args: object) -> asyncio.Future[T]:
        """``work(*args)`` on a pool thread: awaiting the future gives its result or raises its exception (an
        ``ApiError`` for bad input). Counted in ``pending`` until it is done (or cancelled)."""
        future = asyncio.get_running_loop().run_in_executor(self._executor, work, *args)
        self.pending += 1
        future.add_done_callback(self._done)
        return future

    def _done(self, _: asyncio.Future[object]) -> None:
        self.pending -= 1

    def submit(self, work: Callable[[], object]) -> None:
        """Queue ``work`` without waiting for its result."""
        self._executor.submit(work)

    def close(self) -> None:
        """Stop the threads once the work already queued is done (called after the server stopped taking requests)."""
        self._executor.shutdown(wait=True)
