"""Random hex ids (request, trace, span and prediction ids) from ``os.urandom``, read in blocks.

Why not ``secrets.token_hex`` per id: every ``os.urandom`` call releases the GIL, and on a busy server the event loop
then waits for the batch worker's thread to give it back: about 20 us per call under load (profiled), four calls per
request (docs/benchmarks-overhead.md). One 4 KiB read serves about 250 ids and the bytes are the same kernel
randomness, so an id is as unguessable as before. Safe across threads (a lock) and across ``fork`` (a child process
drops the bytes it inherited, or two workers would hand out the same ids)."""

from __future__ import annotations

import os
import threading

BLOCK_BYTES = 4096


class RandomHex:
    def __init__(self, block_bytes: int = BLOCK_BYTES) -> None:
        self.block_bytes = block_bytes
        self._lock = threading.Lock()
        self._block = b""
        self._used = 0

    def __call__(self, nbytes: int) -> str:
        """``nbytes`` random bytes as ``2 * nbytes`` lowercase hex digits."""
        with self._lock:
            if self._used + nbytes > len(self._block):
                self._block, self._used = os.urandom(max(self.block_bytes, nbytes)), 0
            chunk = self._block[self._used:self._used + nbytes]
            self._used += nbytes
        return chunk.hex()

    def forget(self) -> None:
        """Drop the unread bytes (a forked child must not reuse its parent's)."""
        self._block, self._used = b"", 0
        self._lock = threading.Lock()  # a lock held by another thread at fork time would never be released here


random_hex = RandomHex()
os.register_at_fork(after_in_child=random_hex.forget)
