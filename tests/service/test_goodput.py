"""Goodput under costly concurrent requests (``service.engine.batching.worker``): twenty requests that each run as
many batch-sized parts, sent together. They used to be admitted together, run part by part interleaved, finish
together past the timeout and all be answered 504: every forward wasted. Now the worker measures its seconds per
unit of work and refuses at once (503 with Retry-After) what the queue could not finish within the timeout; what it
admits is answered. The server is real (uvicorn on loopback, HTTP)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import numpy as np

from tests.service.conftest import metric_value, random_pixels, serve, settings_for

COSTLY = {"inputs": [{"pixels": p} for p in random_pixels(np.random.default_rng(0), 64)], "n_samples": 8}


def test_costly_requests_sent_together_are_answered_or_refused_at_once_never_timed_out(
        tiny_repository: Path, tmp_path: Path) -> None:
    # 64 inputs x 8 samples = 512 rows = 64 forwards of 8 rows each: twenty of them are far more work than a 2 s
    # timeout holds on any machine this suite runs on
    settings = settings_for(tiny_repository, tmp_path, request_timeout_s=2.0, max_batch_samples=8, max_queue=64,
                            max_request_batches=128)
    with serve(settings) as server:
        warm = httpx.post(f"{server.url}/predict", json=COSTLY, timeout=60)  # the worker measures its rate
        assert warm.status_code == 200, warm.text

        async def fire() -> list[httpx.Response]:
            async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
                return await asyncio.gather(*(client.post("/predict", json=COSTLY) for _ in range(20)))

        responses = asyncio.run(fire())
        codes = [r.status_code for r in responses]
        assert 504 not in codes, codes
        assert set(codes) == {200, 503}, codes
        refused = [r for r in responses if r.status_code == 503]
        assert all(r.headers.get("retry-after") and "request timeout allows" in r.json()["error"] for r in refused)
        text = httpx.get(f"{server.url}/metrics", timeout=10).text
        assert metric_value(text, "director_rejected_requests_total", model="tiny", version="1",
                            reason="timeout") == 0.0
        worker = server.app_state.repository.default_version("tiny").worker
        assert worker.queued_units == 0  # every admitted request answered: its work is off the queue's account
