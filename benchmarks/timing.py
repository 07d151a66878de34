"""One timing loop for the raw-artifact benchmarks."""

from __future__ import annotations

import time
from collections.abc import Callable


def seconds_per_call(call: Callable[[], object], min_calls: int, min_seconds: float,
                     sync: Callable[[], None] = lambda: None) -> float:
    """Mean wall time of ``call`` after one warm-up call: at least ``min_calls`` calls and ``min_seconds``.
    ``sync`` waits for queued device work (``torch.cuda.synchronize`` on a GPU) after every call."""
    call()
    sync()
    calls, start = 0, time.perf_counter()
    while calls < min_calls or time.perf_counter() - start < min_seconds:
        call()
        sync()
        calls += 1
    return (time.perf_counter() - start) / calls
