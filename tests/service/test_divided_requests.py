"""A request that costs more than one batch runs one batch-sized part at a time on a real server: its answer is the
parts joined in order (the same numbers as the inputs sent one by one, noise off), it takes one forward per part, and
small requests to the same model are answered between its parts instead of waiting for all of them."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.service.conftest import (
    copy_version,
    metric_value,
    random_pixels,
    serve,
    settings_for,
    wait_for,
    with_noise_scale,
)

ROWS = 8  # max_batch_samples: sampled rows per forward


@pytest.fixture(scope="module")
def quiet_repository(tiny_artifact: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny image model with its noise off, so the same input gives the same numbers in any batch."""
    repository = tmp_path_factory.mktemp("divided")
    copy_version(with_noise_scale(tiny_artifact, tmp_path_factory.mktemp("quiet") / "v", 0.0), repository, "tiny", "1")
    return repository


def forwards(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return metric_value(text, "director_inference_duration_seconds_count", model="tiny", version="1") or 0.0


def test_a_request_over_one_batch_is_answered_in_order_from_one_forward_per_part(quiet_repository: Path,
                                                                                 tmp_path: Path) -> None:
    pixels = random_pixels(np.random.default_rng(5), 20)
    with serve(settings_for(quiet_repository, tmp_path, max_batch_samples=ROWS)) as server:
        one_by_one = [httpx.post(f"{server.url}/predict", json={"inputs": [{"pixels": p}], "n_samples": 2},
                                 timeout=60).json()["predictions"][0] for p in pixels]  # 2 rows: one batch each
        before = forwards(server.url)
        whole = httpx.post(f"{server.url}/predict", json={"inputs": [{"pixels": p} for p in pixels], "n_samples": 2},
                           timeout=60)
        after = forwards(server.url)
    assert whole.status_code == 200, whole.text
    joined = whole.json()["predictions"]
    assert after - before == 5  # 20 inputs x 2 samples = 40 rows: 5 parts of 4 inputs
    assert [p["label"] for p in joined] == [p["label"] for p in one_by_one]
    for mine, single in zip(joined, one_by_one, strict=True):
        assert mine["confidence"] == pytest.approx(single["confidence"], abs=1e-5)
        assert mine["ood_score"] == pytest.approx(single["ood_score"], abs=1e-4)


def test_small_requests_to_the_same_model_run_between_the_parts_of_a_costly_one(tiny_repository: Path,
                                                                                tmp_path: Path) -> None:
    """One forward at a time on the device, so nothing but the division lets a small request pass the costly one."""
    settings = settings_for(tiny_repository, tmp_path, max_batch_samples=ROWS, max_request_batches=255,
                            concurrent_forwards=1)
    costly = {"inputs": [{"pixels": p} for p in random_pixels(np.random.default_rng(6), 255)], "n_samples": 8}
    small = {"inputs": [{"pixels": random_pixels(np.random.default_rng(7))[0]}], "n_samples": 1}
    with serve(settings) as server:
        worker = server.app_state.repository.default_version("tiny").worker
        answers: list[httpx.Response] = []
        thread = threading.Thread(target=lambda: answers.append(
            httpx.post(f"{server.url}/predict", json=costly, timeout=120)))
        thread.start()
        wait_for(lambda: not worker.idle, "the costly request to reach its worker")
        during: list[int] = []
        with httpx.Client(base_url=server.url, timeout=60) as client:
            while len(during) < 5 and thread.is_alive():
                during.append(client.post("/predict", json=small).status_code)
            still_running = thread.is_alive()
        thread.join(timeout=120)
    assert [a.status_code for a in answers] == [200] and len(answers[0].json()["predictions"]) == 255
    assert during == [200] * 5 and still_running, (during, still_running)
