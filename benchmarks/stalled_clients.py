"""Latency of a well-behaved ``/predict`` with and without stalled uploads.

``python -m benchmarks.stalled_clients [--requests 300] [--stalled 256]``: serves the committed default model
(torch pinned to one thread), sends ``--requests`` sequential one-image predictions on a keep-alive connection and
reports their p50/p99; then opens ``--stalled`` connections that each send ``POST /predict`` headers announcing
100,000 body bytes and one byte of them, and measures again while they stall (the body timeout is raised so that
they stay stalled for the whole run). Prints one JSON object; the figures go to docs/benchmarks.md."""

from __future__ import annotations

import argparse
import json
import socket
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import numpy as np

from benchmarks.server import ROOT, running_server

STALLED_HEAD = (b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: 100000\r\n\r\n{")


def latencies(url: str, requests: int, seed: int) -> list[float]:
    pixels = np.random.default_rng(seed).random((1, 28, 28)).round(4).tolist()
    body = {"inputs": [{"pixels": pixels}], "n_samples": 1}
    out = []
    with httpx.Client(base_url=url, timeout=60) as client:
        for _ in range(10):  # warm the connection and the model
            client.post("/predict", json=body).raise_for_status()
        for _ in range(requests):
            start = time.perf_counter()
            client.post("/predict", json=body).raise_for_status()  # any failure ends the run
            out.append(time.perf_counter() - start)
    return out


def summary(values: list[float]) -> dict[str, float]:
    ms = np.asarray(values) * 1000
    return {"p50_ms": round(float(np.percentile(ms, 50)), 2), "p99_ms": round(float(np.percentile(ms, 99)), 2),
            "requests": len(values)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--stalled", type=int, default=256)
    parser.add_argument("--repository", type=Path, default=ROOT / "model_repository")
    args = parser.parse_args(argv)
    with running_server(args.repository, "fashion-vit", 1, ["--body-timeout-s", "3600"]) as url:
        unloaded = summary(latencies(url, args.requests, 0))
        parts = urlsplit(url)
        stalled = [socket.create_connection((parts.hostname, parts.port)) for _ in range(args.stalled)]
        for sock in stalled:
            sock.sendall(STALLED_HEAD)
        time.sleep(1.0)  # every stalled request reaches the app
        ready = httpx.get(f"{url}/health/ready", timeout=30).status_code
        loaded = summary(latencies(url, args.requests, 1))
        for sock in stalled:
            sock.close()
    result = {"unloaded": unloaded, "with_stalled": {**loaded, "stalled_uploads": args.stalled, "ready": ready},
              "p99_ratio": round(loaded["p99_ms"] / unloaded["p99_ms"], 2),
              "note": "server torch threads 1, client in the same 2-core machine, shared with a training run"}
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
