"""What gRPC request messages may hold of the server's memory: a bound on the bytes of messages in progress, and the
freed pages handed back to the system after large ones.

gRPC receives a whole message before the servicer sees it, so the bound is taken at the earliest point that knows a
message's size: as soon as it has arrived, before it is parsed (parsing copies it, and the infer request copies its
tensors again). A message that would take the bytes in progress past ``limit`` is dropped there and its call refused
with RESOURCE_EXHAUSTED. The bytes still being received are bounded by the calls that may read a message at once
(``grpc_max_concurrent_calls``: a call past it is refused before its message is read; the health calls, exempt from
it, by gRPC's own bound of twice as many calls).

glibc keeps freed memory for reuse instead of returning it: after a free of a large block, its dynamic mmap threshold
rises to that size, so the next large messages come from the heap and their pages stay resident after they are freed
(measured: a burst of 32 messages of 15 MiB left the server 0.7-1.4 GiB over its start). ``Trimmer`` calls
``malloc_trim`` once the last large message in progress is gone, off the event loop and one at a time."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import platform
from collections.abc import Callable, Iterator

from service.errors import ApiError

log = logging.getLogger("service.grpc")
LARGE_MESSAGE_BYTES = 1 << 20  # a message this large asks for a trim once gone


def malloc_trim() -> Callable[[], object] | None:
    """glibc's ``malloc_trim(0)``, or None where the C library is another (musl, macOS): nothing to hand back."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return lambda: trim(0)


class Trimmer:
    """Hands freed heap pages back to the system: one ``malloc_trim`` at a time in a thread (it walks every arena,
    milliseconds on a large heap), and one more after it when a large message was freed while it ran."""

    def __init__(self, release: Callable[[], object] | None = None) -> None:
        self.release = release if release is not None else malloc_trim()
        self.running = False
        self.due = False
        self.trims = 0

    def request(self) -> None:
        if self.release is None:
            return
        self.due = True
        if not self.running:
            self._start()

    def _start(self) -> None:
        self.due, self.running = False, True
        assert self.release is not None
        future = asyncio.get_running_loop().run_in_executor(None, self.release)
        future.add_done_callback(self._done)

    def _done(self, future: asyncio.Future) -> None:
        self.running = False
        self.trims += 1
        if future.cancelled():  # the loop is closing
            return
        if future.exception() is not None:
            log.warning("malloc_trim failed: %s", future.exception())
        elif self.due:
            self._start()


class MessageBytes:
    """Bytes of request messages from their arrival to the end of their call, at most ``limit``; a message of
    ``LARGE_MESSAGE_BYTES`` or more, admitted or refused, asks ``trimmer`` for a trim once no message is held."""

    def __init__(self, limit: int, trimmer: Trimmer | None = None) -> None:
        self.limit = limit
        self.held = 0
        self.trimmer = trimmer if trimmer is not None else Trimmer()
        self.large_seen = False

    @contextlib.contextmanager
    def hold(self, size: int) -> Iterator[None]:
        """Hold ``size`` bytes for the block, or refuse (429, RESOURCE_EXHAUSTED) past the limit."""
        self.large_seen |= size >= LARGE_MESSAGE_BYTES
        if self.held + size > self.limit:
            raise ApiError(429, f"gRPC messages in progress would pass {self.limit} bytes with this one of {size}; "
                                "retry shortly")
        self.held += size
        try:
            yield
        finally:
            self.held -= size

    def settle(self) -> None:
        """Called at the end of every call, once it holds nothing of its message: the trim, when one is due."""
        if self.large_seen and self.held == 0:
            self.large_seen = False
            self.trimmer.request()
