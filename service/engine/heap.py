"""Keep Python's cyclic garbage collector off the request path's tail.

A full (generation 2) collection walks every tracked object in the process. With torch, TorchScript modules,
FastAPI and pydantic loaded that is a pause of about 0.1 s on this CPU, on the event loop thread, once every
few thousand requests; under overload it showed as the p99 of refusals (docs/benchmarks.md). Objects alive
once the models are loaded live as long as the process, so they are collected once and then frozen
(``gc.freeze``: moved to a permanent generation that collections skip). Objects made per request are still
collected as before, and an unloaded version is freed by reference counting once drained (its module and
worker hold no cycles; tests/service/test_repository.py checks both go). Each freeze first thaws, so any cyclic
garbage that did end up frozen is collected at the next load: one pause per model load instead of one every few
thousand requests. ``thaw`` at shutdown hands everything back (the app may be embedded in a longer-lived
process, a test run for one)."""

from __future__ import annotations

import gc
import logging
import time

log = logging.getLogger("service.engine.heap")


def freeze_long_lived() -> None:
    """Collect what is garbage now (frozen objects included), then exempt everything still alive from later
    collections."""
    started = time.perf_counter()
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    log.info("froze %d long-lived objects out of garbage collection in %.3fs", gc.get_freeze_count(),
             time.perf_counter() - started)


def collect_retired() -> None:
    """Free a retired version now: once its worker has closed it may be held only by a reference cycle (a cancelled
    task's exception and its frames), which the rare full collections of a frozen heap would reach late. About 2 ms
    with the long-lived heap frozen, once per unloaded version."""
    gc.collect()


def thaw() -> None:
    """Return the frozen objects to the collector (at shutdown)."""
    gc.unfreeze()
