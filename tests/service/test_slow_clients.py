"""Slow and stalled clients over real HTTP (real uvicorn on loopback, raw sockets for the stalled clients): a body
that does not arrive gets 408 and holds nothing, headers that do not arrive get 408, stalled uploads leave
well-behaved predictions alone, the connection limit holds, and readiness follows a full queue. The p99 figures
with and without stalled uploads are measured by ``benchmarks/stalled_clients.py``, not asserted here."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import numpy as np

from tests.service.conftest import Running, random_pixels, read_response, serve, settings_for, wait_for
from tests.service.test_admission import device_blocked

BODY = {"inputs": [{"pixels": random_pixels(np.random.default_rng(0))[0]}], "n_samples": 2}


def connect(server: Running) -> socket.socket:
    parts = urlsplit(server.url)
    return socket.create_connection((parts.hostname, parts.port), timeout=60)


def stalled_upload(server: Running, path: str = "/predict") -> socket.socket:
    """Headers announcing 100,000 body bytes, then one byte of them, then nothing."""
    sock = connect(server)
    kind = "multipart/form-data; boundary=b" if path == "/predict/image" else "application/json"
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: {kind}\r\n"
                 "Content-Length: 100000\r\n\r\n-".encode())
    return sock


@contextmanager
def stalled_uploads(server: Running, count: int) -> Iterator[list[socket.socket]]:
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            socks.append(stalled_upload(server))
        # every one of them reached the app (a uvicorn task per request in progress)
        wait_for(lambda: len(server.server.server_state.tasks) >= count, f"{count} stalled requests in the app")
        yield socks
    finally:
        for sock in socks:
            sock.close()


def closed_by_server(sock: socket.socket) -> bool:
    with contextlib.suppress(ConnectionResetError):
        return sock.recv(1) == b""
    return True


def test_a_body_that_does_not_arrive_gets_408_and_the_connection_closes(tiny_repository: Path, tmp_path: Path
                                                                          ) -> None:
    settings = settings_for(tiny_repository, tmp_path, body_timeout_s=1.0, max_queue=1)
    with serve(settings) as server:
        worker = server.app_state.repository.default_version("tiny").worker
        with stalled_upload(server) as sock:
            status, fields, body = read_response(sock)
            assert status == 408, body
            assert body == {"error": "request body not received in full within 1 s", "status": 408,
                            "type": "request_timeout", "details": None}
            assert fields["connection"] == "close"
            assert closed_by_server(sock)
        assert worker.pending == 0  # nothing held: the one slot serves the next request
        assert httpx.post(f"{server.url}/predict", json=BODY, timeout=60).status_code == 200


def test_a_stalled_body_holds_no_queue_slot(tiny_repository: Path, tmp_path: Path) -> None:
    """With a queue of one, a stalled upload on each prediction route leaves the slot free for a whole request."""
    settings = settings_for(tiny_repository, tmp_path, body_timeout_s=3600.0, max_queue=1)
    with serve(settings) as server:
        worker = server.app_state.repository.default_version("tiny").worker
        socks = [stalled_upload(server, path) for path in ("/predict", "/v2/models/tiny/infer", "/predict/image")]
        wait_for(lambda: len(server.server.server_state.tasks) >= 3, "the stalled requests in the app")
        assert worker.pending == 0
        assert httpx.get(f"{server.url}/health/ready", timeout=30).status_code == 200
        assert httpx.post(f"{server.url}/predict", json=BODY, timeout=60).status_code == 200
        for sock in socks:
            sock.close()


def test_headers_that_do_not_arrive_get_408(tiny_repository: Path, tmp_path: Path) -> None:
    settings = settings_for(tiny_repository, tmp_path, header_timeout_s=1.0)
    with serve(settings) as server:
        for sent in (b"", b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Le"):
            with connect(server) as sock:
                sock.sendall(sent)
                status, fields, body = read_response(sock)
                assert status == 408, sent
                assert body["type"] == "request_timeout" and "headers" in body["error"]
                assert fields["connection"] == "close" and fields["content-type"] == "application/json"
                assert closed_by_server(sock)
        # a keep-alive connection is not cut between requests by the header timer (the keep-alive timer applies)
        with httpx.Client(base_url=server.url, timeout=30) as client:
            for _ in range(3):
                assert client.get("/health/live").status_code == 200


def test_oversized_or_too_many_headers_get_431_and_the_connection_closes(tiny_repository: Path, tmp_path: Path
                                                                          ) -> None:
    settings = settings_for(tiny_repository, tmp_path, max_header_bytes=8192, max_headers=20)
    with serve(settings) as server:
        big = b"GET /health/live HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 200_000 + b"\r\n\r\n"
        many = (b"GET /health/live HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(40))
                + b"\r\n")
        for request, word in ((big, "larger than 8192 bytes"), (many, "more than 20 header fields")):
            with connect(server) as sock:
                with contextlib.suppress(ConnectionResetError, BrokenPipeError):  # it may close while we send
                    sock.sendall(request)
                status, fields, body = read_response(sock)
                assert status == 431 and word in body["error"], body
                assert fields["connection"] == "close" and closed_by_server(sock)
        # within the limits, on a keep-alive connection that already answered one request: served
        with httpx.Client(base_url=server.url, timeout=30) as client:
            for _ in range(2):
                response = client.get("/health/live", headers={"X-Fine": "a" * 6000,
                                                                **{f"X-{i}": "1" for i in range(10)}})
                assert response.status_code == 200


def test_a_header_flood_is_refused_while_probes_and_predictions_are_served(tiny_repository: Path, tmp_path: Path
                                                                            ) -> None:
    """Eight connections stream 1,000-byte header lines until the server refuses them, and reconnect; meanwhile every
    probe and prediction is answered 200, and every flooding connection that got an answer got 431. (The latencies
    under a flood are measured by ``benchmarks/faults.py``, not asserted here.)"""
    import threading

    settings = settings_for(tiny_repository, tmp_path, max_header_bytes=8192)
    stop, answers, lock = threading.Event(), [], threading.Lock()

    def flood(server: Running, index: int) -> None:
        while not stop.is_set():
            with connect(server) as sock:
                sock.sendall(b"GET /health/live HTTP/1.1\r\nHost: x\r\n")
                try:
                    while not stop.is_set():
                        sock.sendall(b"X-Flood-%d: " % index + b"a" * 1000 + b"\r\n")
                        stop.wait(0.01)
                    continue  # the test is over before this connection was refused: nothing to read
                except OSError:  # refused: the server answered and closed the connection
                    pass
                with contextlib.suppress(OSError, AssertionError):  # an answer cut by the close is not counted
                    status, _, _ = read_response(sock)
                    with lock:
                        answers.append(status)

    with serve(settings) as server:
        threads = [threading.Thread(target=flood, args=(server, i), daemon=True) for i in range(8)]
        for thread in threads:
            thread.start()
        try:
            with httpx.Client(base_url=server.url, timeout=60) as client:
                probes = [client.get("/health/live").status_code for _ in range(40)]
                served = [client.post("/predict", json=BODY).status_code for _ in range(5)]
            wait_for(lambda: len(answers) >= 8, "eight refused flooding connections")
        finally:
            stop.set()
            for thread in threads:
                thread.join(timeout=30)
    assert probes == [200] * 40 and served == [200] * 5
    assert len(answers) >= 8 and set(answers) == {431}, answers


def test_256_stalled_uploads_leave_predictions_and_readiness_alone(tiny_repository: Path, tmp_path: Path) -> None:
    """The default queue (256) and connection limit, as many stalled uploads as the queue has slots."""
    settings = settings_for(tiny_repository, tmp_path, body_timeout_s=3600.0)
    with serve(settings) as server, stalled_uploads(server, 256):
        assert server.app_state.repository.default_version("tiny").worker.pending == 0
        with httpx.Client(base_url=server.url, timeout=60) as client:
            assert client.get("/health/ready").status_code == 200
            for _ in range(5):
                response = client.post("/predict", json=BODY)
                assert response.status_code == 200, response.text
            assert client.post("/v2/models/tiny/infer", json={"inputs": [{
                "name": "pixels", "datatype": "FP32", "shape": [1, 1, 28, 28],
                "data": np.asarray(BODY["inputs"][0]["pixels"]).ravel().tolist()}]}).status_code == 200


def test_connections_beyond_the_limit_are_refused(tiny_repository: Path, tmp_path: Path) -> None:
    settings = settings_for(tiny_repository, tmp_path, body_timeout_s=3600.0, max_connections=4)
    with serve(settings) as server, stalled_uploads(server, 4):
        assert httpx.get(f"{server.url}/health/live", timeout=30).status_code == 503  # uvicorn's, before the app
    with serve(settings) as server:
        assert httpx.get(f"{server.url}/health/live", timeout=30).status_code == 200


def test_readiness_is_503_while_the_default_models_queue_is_full(tiny_repository: Path, tmp_path: Path) -> None:
    settings = settings_for(tiny_repository, tmp_path, max_queue=1, max_batch_delay_ms=0)
    with serve(settings) as server, ThreadPoolExecutor(2) as pool:
        worker = server.app_state.repository.default_version("tiny").worker
        post = {"json": BODY, "timeout": 120}
        with device_blocked(server):  # the first forward waits in the inference thread, the second request queues
            first = pool.submit(httpx.post, f"{server.url}/predict", **post)
            wait_for(lambda: not worker.idle and worker.depth == 0, "the first request in its forward")
            second = pool.submit(httpx.post, f"{server.url}/predict", **post)
            wait_for(lambda: worker.depth == 1, "the second request queued")
            refused = httpx.post(f"{server.url}/predict", **post)
            ready = httpx.get(f"{server.url}/health/ready", timeout=30)
        assert [first.result().status_code, second.result().status_code] == [200, 200]
        assert refused.status_code == 503
        assert ready.status_code == 503 and ready.json()["saturated"] == ["tiny"]
        wait_for(lambda: worker.pending == 0, "the queue to empty")
        assert httpx.get(f"{server.url}/health/ready", timeout=30).status_code == 200
