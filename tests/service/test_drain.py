"""The drain on SIGTERM, over real HTTP against ``python -m service`` as a process: readiness turns 503 first while
predictions are still served (with ``Connection: close``) for the grace period, then new connections are refused,
a request already begun on a keep-alive connection is still answered, idle keep-alive connections are closed
cleanly, and the process exits."""

from __future__ import annotations

import contextlib
import json
import signal
import socket
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np

from tests.service.conftest import random_pixels, read_response, wait_for
from tests.service.test_process import service_process

PIXELS = random_pixels(np.random.default_rng(0))[0]


def request_bytes(method: str, path: str, body: bytes = b"") -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    return head.encode() + b"\r\n" + body


def predict_bytes() -> bytes:
    return request_bytes("POST", "/predict", json.dumps({"inputs": [{"pixels": PIXELS}], "n_samples": 1}).encode())


def refused(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=5):
            return False
    except OSError:
        return True


def eof(sock: socket.socket) -> bool:
    with contextlib.suppress(ConnectionResetError):
        return sock.recv(1) == b""
    return False  # a reset is not a clean close


def test_sigterm_serves_through_the_grace_then_closes_without_losing_a_request(tiny_repository: Path,
                                                                                tmp_path: Path) -> None:
    env = {"DIRECTOR_FEEDBACK_DB": str(tmp_path / "f.sqlite3"), "DIRECTOR_TORCH_THREADS": "1"}
    args = ["--model-repository", str(tiny_repository), "--default-model", "tiny", "--shutdown-grace-s", "3",
            "--poll-interval-s", "0", "--log-level", "warning"]
    with service_process(args, env) as (proc, url):
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
        assert host is not None and port is not None
        connections = [socket.create_connection((host, port), timeout=30) for _ in range(4)]
        for sock in connections:  # each one answered once and kept alive
            sock.sendall(request_bytes("GET", "/health/live"))
            status, fields, _ = read_response(sock)
            assert status == 200 and fields.get("connection") != "close"
        used, begun, idle, ready_probe = connections

        proc.send_signal(signal.SIGTERM)
        probes: list[tuple[int, dict[str, str], dict]] = []

        def turned() -> bool:  # readiness turns first
            ready_probe.sendall(request_bytes("GET", "/health/ready"))
            probes.append(read_response(ready_probe))
            return probes[-1][0] == 503

        wait_for(turned, "readiness to turn 503", timeout_s=30, poll_s=0.05)
        status, fields, body = probes[-1]
        assert body["draining"] is True and fields["connection"] == "close"
        assert eof(ready_probe)  # the server closed it after the response it announced as the last

        # during the grace: predictions on a keep-alive connection and on a new one are served, and close after
        used.sendall(predict_bytes())
        status, fields, body = read_response(used)
        assert status == 200 and fields["connection"] == "close" and body["model"] == "tiny"
        assert eof(used)
        with socket.create_connection((host, port), timeout=30) as fresh:
            fresh.sendall(predict_bytes())
            status, fields, _ = read_response(fresh)
            assert status == 200 and fields["connection"] == "close"

        begun.sendall(b"GET /health/live HTTP/1.1\r\nHost: x\r\n")  # a request that reached the server, half sent
        wait_for(lambda: refused(host, port), "the listener to close after the grace", timeout_s=30, poll_s=0.05)
        assert eof(idle)  # nothing was sent on it: closed cleanly, not reset
        begun.sendall(b"\r\n")
        status, fields, body = read_response(begun)
        assert status == 200 and body["status"] == "alive" and fields["connection"] == "close"
        for sock in connections:
            sock.close()
        assert proc.wait(timeout=60) in (0, -signal.SIGTERM)
