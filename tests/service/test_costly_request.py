"""One model's costly request beside another model's small ones, on a real server: a request over the per-request cost
bound is refused (413, naming the limit) and never reaches a forward; the costliest accepted one runs in many
forwards while small requests to the other model keep being answered beside them (the forward gate's second slot),
instead of queueing behind it. Counts, not speed: how many small requests were answered while the costly one ran
(here 30-40 with two slots, 1 with ``concurrent_forwards=1``; ``benchmarks/faults.py`` measures the latencies)."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx
import numpy as np

from tests.service.conftest import TEXT_MODEL, metric_value, random_pixels, serve, settings_for, wait_for

SMALL = 5  # small text requests that must be answered while the costly image request runs
ROWS, BATCHES = 8, 255  # rows per forward, forwards one request may cost: 2,040 sampled rows


def costly(inputs: int) -> dict:
    return {"model": "tiny", "inputs": [{"pixels": p} for p in random_pixels(np.random.default_rng(2), inputs)],
            "n_samples": 8}


def test_small_requests_to_another_model_are_answered_while_a_costly_one_runs(text_repository: Path,
                                                                            tmp_path: Path) -> None:
    settings = settings_for(text_repository, tmp_path, max_batch_samples=ROWS, max_request_batches=BATCHES,
                            concurrent_forwards=2)
    small = {"model": TEXT_MODEL, "inputs": [{"text": "a fine film"}], "n_samples": 1}
    with serve(settings) as server:
        refused = httpx.post(f"{server.url}/predict", json=costly(256), timeout=60)  # 2,048 rows
        assert refused.status_code == 413 and "DIRECTOR_MAX_REQUEST_BATCHES" in refused.json()["error"]
        text = httpx.get(f"{server.url}/metrics", timeout=30).text
        assert metric_value(text, "director_predictions_total", model="tiny", version="1") == 0.0  # never forwarded

        worker = server.app_state.repository.default_version("tiny").worker
        answers: list[int] = []
        body = costly(255)  # 2,040 rows: 255 forwards
        thread = threading.Thread(target=lambda: answers.append(
            httpx.post(f"{server.url}/predict", json=body, timeout=120).status_code))
        thread.start()
        wait_for(lambda: not worker.idle, "the costly request to reach its worker")
        during = []
        with httpx.Client(base_url=server.url, timeout=60) as client:
            while len(during) < SMALL and not worker.idle:
                during.append(client.post("/predict", json=small).status_code)
            still_running = not worker.idle
        thread.join(timeout=120)
    assert answers == [200]
    assert during == [200] * SMALL and still_running, (during, still_running)
