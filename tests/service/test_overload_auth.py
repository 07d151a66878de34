"""Overload (503 + Retry-After), timeouts (504) and the API key (401). That a refusal comes before the body
is read is shown in test_admission.py (no timings are asserted)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import numpy as np

from tests.service.conftest import metric_value, random_pixels, raw_request, serve, settings_for, wait_for

HEAVY = {"inputs": [{"pixels": p} for p in random_pixels(np.random.default_rng(0), 32)], "n_samples": 8}


def test_full_queue_is_refused_with_retry_after(tiny_repository: Path, tmp_path: Path) -> None:
    # 32 inputs x 8 samples in forwards of 8 rows (32 batches, allowed): each request keeps the worker busy a while
    settings = settings_for(tiny_repository, tmp_path, max_queue=1, max_batch_samples=8, max_batch_delay_ms=0,
                            max_request_batches=32)
    with serve(settings) as server:

        async def fire() -> list[httpx.Response]:
            async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
                return await asyncio.gather(*(client.post("/predict", json=HEAVY) for _ in range(12)))

        results = asyncio.run(fire())
        codes = [r.status_code for r in results]
        assert set(codes) <= {200, 503} and 503 in codes and 200 in codes, codes
        for response in results:
            if response.status_code == 503:
                assert response.headers["retry-after"] == "1"
                assert response.json()["type"] == "unavailable" and "overloaded" in response.json()["error"]
        text = httpx.get(f"{server.url}/metrics").text
        rejected = metric_value(text, "director_rejected_requests_total", model="tiny", version="1",
                                reason="queue_full")
        assert rejected == codes.count(503)


def test_request_over_its_time_limit_gets_504(tiny_repository: Path, tmp_path: Path) -> None:
    settings = settings_for(tiny_repository, tmp_path, request_timeout_s=0.001, max_batch_samples=8,
                            max_batch_delay_ms=50, max_request_batches=32)
    with serve(settings) as server:
        response = httpx.post(f"{server.url}/predict", json=HEAVY, timeout=60)
        assert response.status_code == 504 and response.json()["type"] == "timeout"
        text = httpx.get(f"{server.url}/metrics").text
        assert metric_value(text, "director_rejected_requests_total", model="tiny", version="1",
                            reason="timeout") == 1.0
        # the timed-out request's parts that never ran come off the worker's account of queued work
        worker = server.app_state.repository.default_version("tiny").worker
        wait_for(lambda: worker.queued_units == 0, "the queued work to drain", timeout_s=30)


def test_api_key_guards_everything_but_health_and_metrics(tiny_repository: Path, tmp_path: Path) -> None:
    with serve(settings_for(tiny_repository, tmp_path, api_key="s3cret")) as server:
        body = {"inputs": [{"pixels": random_pixels(np.random.default_rng(1))[0]}]}
        for method, path, payload in [("POST", "/predict", body), ("GET", "/models", None),
                                      ("GET", "/models/tiny", None), ("POST", "/feedback", {"id": "x", "label": 1}),
                                      ("GET", "/v2", None), ("GET", "/v2/models/tiny", None)]:
            missing = httpx.request(method, f"{server.url}{path}", json=payload)
            assert missing.status_code == 401, path
            assert missing.headers["www-authenticate"] == "Bearer" and missing.json()["type"] == "unauthorized"
            wrong = httpx.request(method, f"{server.url}{path}", json=payload,
                                  headers={"Authorization": "Bearer wrong"})
            assert wrong.status_code == 401, path
        ok = httpx.post(f"{server.url}/predict", json=body, headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200
        for path in ("/health/live", "/health/ready", "/metrics", "/v2/health/live", "/v2/health/ready"):
            assert httpx.get(f"{server.url}{path}").status_code == 200, path


def test_metrics_can_need_the_key_and_health_can_keep_its_inventory(tiny_repository: Path, tmp_path: Path) -> None:
    settings = settings_for(tiny_repository, tmp_path, api_key="s3cret", metrics_require_key=True,
                            health_details=False)
    with serve(settings) as server:
        assert httpx.get(f"{server.url}/metrics").status_code == 401
        keyed = httpx.get(f"{server.url}/metrics", headers={"Authorization": "Bearer s3cret"})
        assert keyed.status_code == 200 and "director_" in keyed.text
        ready = httpx.get(f"{server.url}/health/ready")
        assert ready.status_code == 200 and ready.json()["status"] == "ready"
        assert ready.json()["models"] == {} and "tiny" not in ready.text


def test_an_empty_api_key_guards_nothing(tiny_repository: Path, tmp_path: Path) -> None:
    """DIRECTOR_API_KEY= (compose passes a variable left empty in .env as "") is no key: before, it was a key no
    bearer token could match, and every request got 401."""
    with serve(settings_for(tiny_repository, tmp_path, api_key="")) as server:
        assert server.app_state.settings.api_key is None
        body = {"inputs": [{"pixels": random_pixels(np.random.default_rng(2))[0]}]}
        for headers in ({}, {"Authorization": "Bearer anything"}, {"Authorization": "Basic eDp5"}):
            assert httpx.post(f"{server.url}/predict", json=body, headers=headers).status_code == 200, headers
            assert httpx.get(f"{server.url}/models", headers=headers).status_code == 200, headers


BIG = 15_000_000  # an announced 15 MB body (over the 1 MB body limit these servers get)


def test_without_the_key_the_body_is_never_read(tiny_repository: Path, tmp_path: Path) -> None:
    """401 from the headers alone: it arrives while the announced 15 MB body has not been sent, so nothing of it was
    read or parsed (before, the whole body was received and parsed as JSON first)."""
    with serve(settings_for(tiny_repository, tmp_path, api_key="s3cret", max_body_bytes=1_000_000)) as server:
        for path in ("/predict", "/v2/models/tiny/infer", "/feedback", "/predict/image", "/no-such-route"):
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic s3cret"}):
                status, fields, body = raw_request(server.url, path, BIG, b'{"inputs": [', headers)
                assert status == 401, (path, headers, body)  # 401 before the body limit's 413: nothing is revealed
                assert fields["www-authenticate"] == "Bearer" and body["type"] == "unauthorized"
                assert set(body) == {"error", "status", "type", "details"}
        status, _, body = raw_request(server.url, "/predict", BIG, b"{", {"Authorization": "Bearer s3cret"})
        assert status == 413  # with the key, the body limit applies as before
        text = httpx.get(f"{server.url}/metrics").text
        assert metric_value(text, "director_requests_total", endpoint="/predict", code="401") == 3.0
        assert metric_value(text, "director_requests_total", endpoint="unmatched", code="401") == 3.0


DOCS = ("/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect")


def test_docs_and_schema_need_the_key_unless_opened(tiny_repository: Path, tmp_path: Path) -> None:
    with serve(settings_for(tiny_repository, tmp_path, api_key="s3cret")) as server:
        for path in DOCS:
            assert httpx.get(f"{server.url}{path}").status_code == 401, path
            assert httpx.get(f"{server.url}{path}", headers={"Authorization": "Bearer s3cret"}).status_code == 200
    with serve(settings_for(tiny_repository, tmp_path, api_key="s3cret", public_docs=True)) as server:
        for path in DOCS:
            assert httpx.get(f"{server.url}{path}").status_code == 200, path
        assert "/predict" in httpx.get(f"{server.url}/openapi.json").json()["paths"]
        assert httpx.get(f"{server.url}/models").status_code == 401  # only the documentation is opened


def test_the_key_can_come_from_a_file(tiny_repository: Path, tmp_path: Path) -> None:
    secret = tmp_path / "api-key"
    secret.write_text("from-a-file\n")  # as `echo key > file` writes it: the newline is not part of the key
    with serve(settings_for(tiny_repository, tmp_path, api_key_file=secret)) as server:
        assert server.app_state.settings.api_key is not None
        assert httpx.get(f"{server.url}/models").status_code == 401
        ok = httpx.get(f"{server.url}/models", headers={"Authorization": "Bearer from-a-file"})
        assert ok.status_code == 200
