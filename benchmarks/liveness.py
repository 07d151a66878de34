"""``/health/live`` latency while the largest allowed request is being prepared.

``python -m benchmarks.liveness [--large-requests 10]``: serves the committed default model (torch pinned to one
thread, the default settings), measures ``/health/live`` alone, then sends ``--large-requests`` sequential requests
that each carry the most decoded pixels a request may (``DIRECTOR_MAX_REQUEST_PIXELS``, 16 M: 256 PNGs of 250 x 250)
while a second client probes ``/health/live`` every ``--probe-every-ms``. Decoding runs in the server's bounded
thread pool, so the event loop should keep answering probes; the target is a probe p99 under 100 ms. Prints one JSON
object; the figures go to docs/benchmarks.md."""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import threading
import time
from pathlib import Path

import httpx
import numpy as np
from PIL import Image

from benchmarks.server import ROOT, running_server
from benchmarks.stalled_clients import summary

SIDE, IMAGES = 250, 256  # 256 x 250 x 250 = 16,000,000 decoded pixels: the default per-request budget


def large_body(seed: int) -> dict:
    """256 greyscale PNGs of 250 x 250 (2 x 2 blocks of noise: they decode like photos, and the base64 body stays
    under the default 16 MB limit)."""
    rng = np.random.default_rng(seed)
    inputs = []
    for _ in range(IMAGES):
        blocks = rng.integers(0, 256, (SIDE // 2, SIDE // 2), dtype=np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(blocks.repeat(2, axis=0).repeat(2, axis=1)).save(buffer, format="PNG")
        inputs.append({"image_base64": base64.b64encode(buffer.getvalue()).decode()})
    return {"inputs": inputs, "n_samples": 1}


def probe(url: str, stop: threading.Event, every_s: float, out: list[float]) -> None:
    with httpx.Client(base_url=url, timeout=30) as client:
        while not stop.is_set():
            start = time.perf_counter()
            client.get("/health/live").raise_for_status()
            out.append(time.perf_counter() - start)
            time.sleep(every_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--large-requests", type=int, default=10)
    parser.add_argument("--probe-every-ms", type=float, default=10.0)
    parser.add_argument("--repository", type=Path, default=ROOT / "model_repository")
    args = parser.parse_args(argv)
    body = json.dumps(large_body(0)).encode()
    with running_server(args.repository, "fashion-vit", 1, []) as url:
        idle: list[float] = []
        stop = threading.Event()
        thread = threading.Thread(target=probe, args=(url, stop, args.probe_every_ms / 1000, idle))
        thread.start()
        time.sleep(3.0)
        stop.set()
        thread.join()
        during: list[float] = []
        large: list[float] = []
        stop = threading.Event()
        thread = threading.Thread(target=probe, args=(url, stop, args.probe_every_ms / 1000, during))
        with httpx.Client(base_url=url, timeout=300) as client:
            thread.start()
            for _ in range(args.large_requests):
                start = time.perf_counter()
                response = client.post("/predict", content=body, headers={"Content-Type": "application/json"})
                large.append(time.perf_counter() - start)
                if response.status_code != 200 or len(response.json()["predictions"]) != IMAGES:
                    raise RuntimeError(f"the large request failed: {response.status_code} {response.text[:300]}")
            stop.set()
            thread.join()
    result = {"idle_probes": summary(idle), "probes_during_large_requests": summary(during),
              "large_request": {**summary(large), "images": IMAGES, "side": SIDE, "body_bytes": len(body),
                                "decoded_pixels": IMAGES * SIDE * SIDE},
              "probe_p99_under_100_ms": summary(during)["p99_ms"] < 100, "load_average_1m": os.getloadavg()[0],
              "note": "server torch threads 1 and 2 decode threads (defaults); client on the same machine"}
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
