"""What each way of sending an image costs the server: the same Fashion-MNIST test image through every input path, at
1 and 32 clients, in one run.

``python -m benchmarks.input_paths [--seconds 6] [--rounds 2]``: serves the committed repository (torch pinned to 1
thread) and drives ``fashion-vit`` at ``n_samples`` 1 (where the request path's own cost shows most) with
``benchmarks.loadgen``'s closed loop, the paths interleaved round by round:

- ``predict_pixels``: ``POST /predict`` with ``{"pixels": [[...]]}`` (a nested JSON list of 784 floats);
- ``predict_base64``: ``POST /predict`` with ``{"image_base64": ...}`` (the PNG file, 0.4 KB);
- ``predict_upload``: ``POST /predict/image``, the PNG as a multipart upload;
- ``oip_json``: ``POST /v2/models/fashion-vit/infer`` with the tensor's data as a flat JSON list;
- ``oip_binary``: the same with the tensor as raw little-endian float32 bytes (the binary tensor extension).

Prints one JSON object and writes it to ``--out``; the figures go to docs/benchmarks.md ("Input paths").
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from benchmarks.loadgen import closed_loop, encode_post, encode_request
from benchmarks.server import ROOT, running_server

MODEL = "fashion-vit"
BOUNDARY = "director-benchmark-boundary"


def first_test_image() -> np.ndarray:
    """The first Fashion-MNIST test image, [28, 28] uint8."""
    from training.data.images import load_fashion_mnist_split  # the pipeline's reader of the idx files

    image = load_fashion_mnist_split("/usr/share/datasets/fashion-mnist", "test").images[0, 0]  # [28, 28] in [0, 1]
    return (image * 255).round().to(dtype=torch.uint8).numpy()


def requests(url: str, image: np.ndarray) -> dict[str, bytes]:
    pixels = (image.astype(np.float32) / 255.0).round(4)  # [28, 28], four decimals as a client would send them
    png = io.BytesIO()
    Image.fromarray(image, mode="L").save(png, format="PNG")
    infer = f"/v2/models/{MODEL}/infer"
    header = json.dumps({"inputs": [{"name": "pixels", "datatype": "FP32", "shape": [1, 1, 28, 28],
                                     "parameters": {"binary_data_size": 28 * 28 * 4}}],
                         "parameters": {"n_samples": 1}}, separators=(",", ":")).encode()
    upload = (f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"n_samples\"\r\n\r\n1\r\n"
              f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"x.png\"\r\n"
              "Content-Type: image/png\r\n\r\n").encode() + png.getvalue() + f"\r\n--{BOUNDARY}--\r\n".encode()
    return {
        "predict_pixels": encode_post(url, "/predict", {"model": MODEL, "n_samples": 1,
                                                         "inputs": [{"pixels": [pixels.tolist()]}]}),
        "predict_base64": encode_post(url, "/predict", {"model": MODEL, "n_samples": 1, "inputs": [
            {"image_base64": base64.b64encode(png.getvalue()).decode()}]}),
        "predict_upload": encode_request(url, "/predict/image", upload, f"multipart/form-data; boundary={BOUNDARY}"),
        "oip_json": encode_post(url, infer, {"inputs": [{"name": "pixels", "datatype": "FP32",
                                                          "shape": [1, 1, 28, 28],
                                                          "data": pixels.reshape(-1).tolist()}],
                                             "parameters": {"n_samples": 1}}),
        "oip_binary": encode_request(url, infer, header + pixels.astype("<f4").tobytes(), "application/octet-stream",
                                     {"Inference-Header-Content-Length": str(len(header))}),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=6.0, help="per path, client count and round")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved repetitions (the median is reported)")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks-input-paths.json")
    args = parser.parse_args(argv)
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {}
    with running_server(ROOT / "model_repository", MODEL, 1, []) as url:
        bodies = requests(url, first_test_image())
        for _ in range(args.rounds):
            for clients in args.clients:
                for path, raw in bodies.items():
                    result = asyncio.run(closed_loop(url, raw, clients, 10**7, args.seconds))
                    assert result["ok"] > 0 and set(result["codes"]) == {"200"}, (path, result["codes"])
                    runs.setdefault(path, {}).setdefault(str(clients), []).append(result)
    summary = {path: {clients: {"requests_per_s": statistics.median(r["throughput_rps"] for r in rows),
                                "spread_rps": [min(r["throughput_rps"] for r in rows),
                                               max(r["throughput_rps"] for r in rows)],
                                "p50_ms": statistics.median(r["p50_ms"] for r in rows),
                                "p99_ms": statistics.median(r["p99_ms"] for r in rows)}
                      for clients, rows in by_clients.items()}
               for path, by_clients in runs.items()}
    results = {"model": MODEL, "n_samples": 1, "threads": 1, "seconds": args.seconds, "rounds": args.rounds,
               "paths": summary}
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
