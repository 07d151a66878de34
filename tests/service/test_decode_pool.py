"""Inputs are prepared in the decode pool, off the event loop, within a per-request budget of decoded pixels.

No timings are asserted (speed is measured in benchmarks): what is shown is that the event loop answers
``/health/live`` while a request's inputs are being prepared, and that preparing them goes through the pool (with
the pool's one thread held, a request waits, and is served once it is released)."""

from __future__ import annotations

import base64
import io
import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image

from service.engine.decoding import THREAD_PREFIX
from tests.service.conftest import TEXT_MODEL, Running, png_base64, random_pixels, serve, settings_for, wait_for

SIDE = 2000  # 4 M pixels, the default per-image limit
BUDGET = 16 * SIDE * SIDE


def black_png(side: int) -> str:
    """A ``side`` x ``side`` black PNG: a few kB to send, ``side``**2 pixels to decode."""
    buffer = io.BytesIO()
    Image.new("L", (side, side)).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


@pytest.fixture(scope="module")
def server(tiny_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    """One decode thread, and a budget of sixteen of the largest images per request."""
    settings = settings_for(tiny_repository, tmp_path_factory.mktemp("decode-pool"), decode_threads=1,
                            max_request_pixels=BUDGET, max_image_pixels=SIDE * SIDE)
    with serve(settings) as running:
        yield running


def test_liveness_answers_while_the_largest_request_decodes(server: Running) -> None:
    pool = server.app_state.decoder
    body = {"inputs": [{"image_base64": black_png(SIDE)}] * 16, "n_samples": 1}  # exactly the budget
    answered_while_decoding = 0
    with ThreadPoolExecutor(1) as executor, httpx.Client(base_url=server.url, timeout=60) as client:
        large = executor.submit(httpx.post, f"{server.url}/predict", json=body, timeout=120)
        wait_for(lambda: pool.pending == 1 or large.done(), "the request to reach the decode pool")
        while not large.done():
            live = client.get("/health/live")
            assert live.status_code == 200 and live.json()["status"] == "alive"
            answered_while_decoding += pool.pending == 1 and not large.done()
        response = large.result()
    assert response.status_code == 200, response.text
    assert len(response.json()["predictions"]) == 16
    assert answered_while_decoding > 0  # the loop answered probes while the request's images were being decoded
    assert any(t.name.startswith(THREAD_PREFIX) for t in threading.enumerate())


@pytest.mark.parametrize("route", ["/predict", "/predict/image", "/v2/models/tiny/infer"])
def test_inputs_are_prepared_in_the_pool(server: Running, route: str) -> None:
    """With the pool's only thread held, a request waits for it (so it never decodes on the event loop), the loop
    meanwhile answers probes, and the request is served once the thread is free."""
    pool = server.app_state.decoder
    pixels = random_pixels(np.random.default_rng(0))
    if route == "/predict":
        request = {"json": {"inputs": [{"image_base64": png_base64(np.zeros((28, 28), np.uint8))}], "n_samples": 1}}
    elif route == "/predict/image":
        request = {"files": {"file": ("x.png", base64.b64decode(png_base64(np.zeros((28, 28), np.uint8))))}}
    else:
        request = {"content": json.dumps({"inputs": [{"name": "pixels", "datatype": "FP32", "shape": [1, 1, 28, 28],
                                                      "data": pixels}]})}
    gate = threading.Event()
    pool.submit(gate.wait)
    try:
        with ThreadPoolExecutor(1) as executor:
            waiting = executor.submit(httpx.post, f"{server.url}{route}", timeout=60, **request)
            wait_for(lambda: pool.pending == 1, "the request to wait for the decode pool")
            assert httpx.get(f"{server.url}/health/live").status_code == 200
            assert not waiting.done()
            gate.set()
            response = waiting.result()
    finally:
        gate.set()
    assert response.status_code == 200, response.text
    wait_for(lambda: pool.pending == 0, "the pool to be idle")


def test_a_request_over_its_pixel_budget_is_413(server: Running) -> None:
    over = {"inputs": [{"image_base64": black_png(SIDE)}] * 16 + [{"image_base64": black_png(2)}]}
    response = httpx.post(f"{server.url}/predict", json=over, timeout=60)
    assert response.status_code == 413 and response.json()["type"] == "too_large"
    assert "inputs.16.image_base64" in response.json()["error"] and str(BUDGET) in response.json()["error"]
    # pixel arrays are not decoded: they do not count against the budget
    pixels = random_pixels(np.random.default_rng(1))[0]
    mixed = {"inputs": [{"image_base64": black_png(SIDE)}] * 16 + [{"pixels": pixels}], "n_samples": 1}
    assert httpx.post(f"{server.url}/predict", json=mixed, timeout=60).status_code == 200


def test_text_is_tokenized_in_the_pool(text_server: Running) -> None:
    pool = text_server.app_state.decoder
    gate = threading.Event()
    for _ in range(pool.threads):  # every thread held
        pool.submit(gate.wait)
    try:
        with ThreadPoolExecutor(2) as executor:
            futures = [executor.submit(httpx.post, f"{text_server.url}/predict", timeout=60,
                                       json={"inputs": [{"text": "a fine film"}], "n_samples": 1}),
                       executor.submit(httpx.post, f"{text_server.url}/v2/models/{TEXT_MODEL}/infer", timeout=60,
                                       json={"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1],
                                                         "data": ["a fine film"]}]})]
            # the OIP request waits to be parsed, the /predict one to be tokenised
            wait_for(lambda: pool.pending == 2, "both requests to wait for the decode pool")
            gate.set()
            assert [f.result().status_code for f in futures] == [200, 200]
    finally:
        gate.set()
