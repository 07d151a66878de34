"""A request whose client leaves while it waits in its model's queue is dropped before its forward: the queued request
is cancelled when the connection closes (the handler answers 499, counted), and the model never predicts it."""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import numpy as np

from tests.service.conftest import metric_value, random_pixels, serve, settings_for, wait_for

COSTLY = 255  # inputs x S=8 in forwards of 8 rows: the worker stays busy while the other request waits behind it


def test_a_request_whose_client_left_never_reaches_a_forward(tiny_repository: Path, tmp_path: Path) -> None:
    settings = settings_for(tiny_repository, tmp_path, max_batch_samples=8, max_request_batches=COSTLY)
    costly = {"inputs": [{"pixels": p} for p in random_pixels(np.random.default_rng(2), COSTLY)], "n_samples": 8}
    small = json.dumps({"inputs": [{"pixels": random_pixels(np.random.default_rng(3))[0]}], "n_samples": 8}).encode()
    with serve(settings) as server:
        worker = server.app_state.repository.default_version("tiny").worker
        answers: list[int] = []
        thread = threading.Thread(target=lambda: answers.append(
            httpx.post(f"{server.url}/predict", json=costly, timeout=120).status_code))
        thread.start()
        wait_for(lambda: not worker.idle, "the costly request to reach its worker")
        parts = urlsplit(server.url)
        with socket.create_connection((parts.hostname, parts.port), timeout=30) as sock:
            sock.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         + f"Content-Length: {len(small)}\r\n\r\n".encode() + small)
            wait_for(lambda: worker.depth == 1, "the request to queue behind the costly one")
        thread.join(timeout=120)
        wait_for(lambda: worker.idle, "the worker to finish")
        text = httpx.get(f"{server.url}/metrics", timeout=30).text
    assert answers == [200]
    assert metric_value(text, "director_predictions_total", model="tiny", version="1") == COSTLY  # not COSTLY + 1
    assert metric_value(text, "director_requests_total", endpoint="/predict", code="499") == 1
