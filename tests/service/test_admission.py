"""Admission control over real HTTP: an overloaded model refuses before the request body is read.

The queue is filled deterministically: the test holds the device lock, so the first request's forward
blocks in the inference thread and the next one waits in the queue (``max_queue`` 1). Everything after that
is refused, and a refusal that arrives while its body has not even been sent proves it came before the body
was read. No timings are asserted."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import numpy as np

from service.api.admission import Target, match
from service.engine.batching import BatchWorker
from tests.service.conftest import (
    Running,
    copy_version,
    metric_value,
    random_pixels,
    raw_request,
    serve,
    settings_for,
    wait_for,
)

KEY = "s3cret"
AUTH = {"Authorization": f"Bearer {KEY}"}
NO_LAPSE = 3600.0  # request_timeout_s (and slot lapse) far beyond any wait here, so a leaked slot stays visible
BODY = {"inputs": [{"pixels": random_pixels(np.random.default_rng(0))[0]}], "n_samples": 2}


def worker_of(server: Running, model: str) -> BatchWorker:
    entry = server.app_state.repository.default_version(model)
    assert entry is not None and entry.worker is not None
    return entry.worker


@contextmanager
def device_blocked(server: Running) -> Iterator[None]:
    """Forwards wait (in the inference thread) until the block ends."""
    lock = server.app_state.device.lock
    lock.acquire()
    try:
        yield
    finally:
        lock.release()


def fill(server: Running, pool: ThreadPoolExecutor, model: str) -> list[Future]:
    """With the device blocked: one request of ``model`` in its (blocked) forward and one queued, so its
    queue of 1 is full; returns the admitted requests' futures."""
    worker = worker_of(server, model)
    post = {"json": {**BODY, "model": model}, "headers": AUTH, "timeout": 120}
    first = pool.submit(httpx.post, f"{server.url}/predict", **post)
    wait_for(lambda: not worker.idle and worker.depth == 0, f"{model}: first request in its forward")
    second = pool.submit(httpx.post, f"{server.url}/predict", **post)
    wait_for(lambda: worker.depth == 1, f"{model}: second request queued")
    return [first, second]


def assert_refusal(status: int, headers: dict[str, str] | httpx.Headers, body: dict) -> None:
    assert status == 503, (status, body)
    assert headers["retry-after"] == "1"
    assert body["status"] == 503 and body["type"] == "unavailable" and "overloaded" in body["error"]
    assert set(body) == {"error", "status", "type", "details"}


def counters(server: Running) -> dict[str, float]:
    text = httpx.get(f"{server.url}/metrics").text
    return {
        "predict_503": metric_value(text, "director_requests_total", endpoint="/predict", code="503") or 0.0,
        "oip_503": metric_value(text, "director_requests_total", endpoint="/v2/models/{name}/infer",
                                code="503") or 0.0,
        "predict_200": metric_value(text, "director_requests_total", endpoint="/predict", code="200") or 0.0,
        "queue_full": metric_value(text, "director_rejected_requests_total", model="tiny", version="1",
                                   reason="queue_full") or 0.0,
    }


def test_full_queue_refuses_before_the_body_is_read(tiny_repository: Path, tmp_path: Path) -> None:
    settings = settings_for(tiny_repository, tmp_path, max_queue=1, max_batch_delay_ms=0, api_key=KEY,
                            request_timeout_s=NO_LAPSE)
    with serve(settings) as server, ThreadPoolExecutor(4) as pool:
        before = counters(server)
        with device_blocked(server):
            admitted = fill(server, pool, "tiny")
            # a body announced but never sent: only a refusal before reading it can answer
            status, headers, body = raw_request(server.url, "/predict", 1_000_000, b'{"inputs": [', AUTH)
            assert_refusal(status, headers, body)
            status, headers, body = raw_request(server.url, "/v2/models/tiny/infer", 500_000, b"{", AUTH)
            assert_refusal(status, headers, body)
            # a large body sent whole: refused, and the connection stays usable (the server discarded the body)
            large = json.dumps({"inputs": [{"pixels": random_pixels(np.random.default_rng(1))[0]}] * 200})
            with httpx.Client(base_url=server.url, headers=AUTH, timeout=60) as client:
                refused = client.post("/predict", content=large, headers={"Content-Type": "application/json"})
                assert_refusal(refused.status_code, refused.headers, refused.json())
                assert client.get("/models").status_code == 200  # same keep-alive connection
                oip = client.post("/v2/models/tiny/infer", json={"inputs": []})
                assert_refusal(oip.status_code, oip.headers, oip.json())
            # without the API key the answer is 401 (the load is nobody else's business), full queue or not
            unauthorized = httpx.post(f"{server.url}/predict", json=BODY, timeout=60)
            assert unauthorized.status_code == 401
            # the admitted requests are still waiting: nothing they sent was dropped
            assert not any(f.done() for f in admitted)
        responses = [f.result() for f in admitted]
        assert [r.status_code for r in responses] == [200, 200]
        assert all(r.json()["n_samples"] == 2 for r in responses)
        after = counters(server)
        assert after["predict_503"] - before["predict_503"] == 2
        assert after["oip_503"] - before["oip_503"] == 2
        assert after["queue_full"] - before["queue_full"] == 4
        assert after["predict_200"] - before["predict_200"] == 2
        worker = worker_of(server, "tiny")
        # every reservation was used or given back (a slot is released just after its response is sent)
        wait_for(lambda: worker.pending == 0, "every slot free")
        ok = httpx.post(f"{server.url}/predict", json=BODY, headers=AUTH, timeout=60)
        assert ok.status_code == 200


def test_a_request_that_fails_validation_gives_its_slot_back(tiny_repository: Path, tmp_path: Path) -> None:
    settings = settings_for(tiny_repository, tmp_path, max_queue=1, max_batch_delay_ms=0, request_timeout_s=NO_LAPSE)
    with serve(settings) as server:
        for bad in ({"inputs": []}, {**BODY, "n_samples": 0}, {"inputs": [{"pixels": [[0.5]]}]}):
            assert httpx.post(f"{server.url}/predict", json=bad, timeout=60).status_code == 422
        assert httpx.post(f"{server.url}/v2/models/tiny/infer", content=b"{", timeout=60).status_code == 400
        worker = worker_of(server, "tiny")
        wait_for(lambda: worker.pending == 0, "every slot free")  # released just after each response is sent
        # with max_queue 1 a leaked slot would refuse this one
        assert httpx.post(f"{server.url}/predict", json=BODY, timeout=60).status_code == 200


def test_predict_is_refused_early_only_when_every_model_is_full(tiny_artifact: Path, tmp_path: Path) -> None:
    repository = tmp_path / "repo"
    copy_version(tiny_artifact, repository, "tiny", "1")
    copy_version(tiny_artifact, repository, "other", "1")
    settings = settings_for(repository, tmp_path, max_queue=1, max_batch_delay_ms=0, api_key=KEY,
                            request_timeout_s=NO_LAPSE)
    with serve(settings) as server, ThreadPoolExecutor(6) as pool:
        with device_blocked(server):
            admitted = fill(server, pool, "tiny")
            # the default model is full but "other" has room: /predict cannot be refused before its body says
            # which model it wants; naming the full default it is refused after the body (the same answer), and
            # before its inputs reach the decode pool
            decoder = server.app_state.decoder
            decoded: list[object] = []
            run = decoder.run

            async def counting_run(work: Any, *args: object) -> Any:
                decoded.append(work)
                return await run(work, *args)

            decoder.run = counting_run  # type: ignore[method-assign]
            late = httpx.post(f"{server.url}/predict", json=BODY, headers=AUTH, timeout=60)
            decoder.run = run  # type: ignore[method-assign]
            assert_refusal(late.status_code, late.headers, late.json())
            assert decoded == []
            admitted += fill(server, pool, "other")  # admitted: "other" had room
            assert worker_of(server, "tiny").pending == 1  # only its own queued request holds a slot
            # now every model is full: refused before the body
            status, headers, body = raw_request(server.url, "/predict", 1_000_000, b"{", AUTH)
            assert_refusal(status, headers, body)
            status, headers, body = raw_request(server.url, "/v2/models/other/infer", 1_000_000, b"{", AUTH)
            assert_refusal(status, headers, body)
            assert not any(f.done() for f in admitted)
        responses = [f.result() for f in admitted]
        assert [r.status_code for r in responses] == [200] * 4
        assert [r.json()["model"] for r in responses] == ["tiny", "tiny", "other", "other"]
        wait_for(lambda: all(worker_of(server, m).pending == 0 for m in ("tiny", "other")), "every slot free")


def test_a_slot_is_reserved_only_once_the_body_is_in(tiny_repository: Path, tmp_path: Path) -> None:
    """A request admitted on its headers holds no slot while its body is still arriving."""
    settings = settings_for(tiny_repository, tmp_path, max_queue=1, max_batch_delay_ms=0, body_timeout_s=NO_LAPSE)
    with serve(settings) as server:
        worker = worker_of(server, "tiny")
        parts = urlsplit(server.url)
        with socket.create_connection((parts.hostname, parts.port), timeout=60) as stalled:
            stalled.sendall(f"POST /predict HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: application/json\r\n"
                            "Content-Length: 100000\r\n\r\n{".encode())
            wait_for(lambda: len(server.server.server_state.tasks) == 1, "the stalled request in the app")
            assert worker.pending == 0
            assert httpx.post(f"{server.url}/predict", json=BODY, timeout=60).status_code == 200


def test_prediction_routes_are_recognised_without_the_router() -> None:
    assert match("POST", "/predict") == Target("/predict", None, None)
    assert match("POST", "/predict/image") == Target("/predict/image", None, None)
    assert match("POST", "/v2/models/m/infer") == Target("/v2/models/{name}/infer", "m", None)
    assert match("POST", "/v2/models/m/versions/2/infer") == Target("/v2/models/{name}/versions/{version}/infer",
                                                                    "m", "2")
    for method, path in [("GET", "/predict"), ("POST", "/feedback"), ("POST", "/v2/models//infer"),
                         ("POST", "/v2/models/m"), ("POST", "/v2/models/m/versions/2/ready"), ("POST", "/predictx")]:
        assert match(method, path) is None, (method, path)


def test_a_request_costing_more_than_its_share_is_413_before_it_is_queued(tiny_repository: Path, tmp_path: Path
                                                                          ) -> None:
    """With 16-row batches and 2 batches per request, 4 inputs x 8 samples (32 rows) are served and 5 x 8 are
    refused, naming the limit; the refused request never reaches a forward."""
    settings = settings_for(tiny_repository, tmp_path, max_batch_samples=16, max_request_batches=2)
    rng = np.random.default_rng(5)
    with serve(settings) as server:
        ok = httpx.post(f"{server.url}/predict", timeout=60,
                        json={"inputs": [{"pixels": p} for p in random_pixels(rng, 4)], "n_samples": 8})
        assert ok.status_code == 200, ok.text
        before = metric_value(httpx.get(f"{server.url}/metrics").text, "director_predictions_total", model="tiny",
                              version="1")
        refused = httpx.post(f"{server.url}/predict", timeout=60,
                             json={"inputs": [{"pixels": p} for p in random_pixels(rng, 5)], "n_samples": 8})
        assert refused.status_code == 413 and "DIRECTOR_MAX_REQUEST_BATCHES" in refused.json()["error"]
        assert "40 sampled rows" in refused.json()["error"] and "at most 32" in refused.json()["error"]
        after = metric_value(httpx.get(f"{server.url}/metrics").text, "director_predictions_total", model="tiny",
                             version="1")
        assert after == before
