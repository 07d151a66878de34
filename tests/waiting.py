"""The suite's two waits on a condition (re-exported by tests/service/conftest.py): ``wait_for`` in a thread and
``until`` inside an event loop. Tests wait on what they need, never for a fixed time; the timeout only turns a hang
into a failure. ``poll_s`` spaces the checks: the default suits an in-process flag, a check that asks another process
over HTTP (or starts one) takes a longer one so that it leaves the CPU to the process it waits on."""

from __future__ import annotations

import asyncio
import time
from typing import Any


def wait_for(condition: Any, what: str, timeout_s: float = 60.0, poll_s: float = 0.005) -> None:
    """Poll ``condition()`` until true; the timeout only turns a hang into a failure."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(poll_s)


async def until(condition: Any, what: str, timeout_s: float = 60.0, poll_s: float = 0.001) -> None:
    """``wait_for`` inside an event loop: yield to it until ``condition()`` holds (what it waits on runs there)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(poll_s)
