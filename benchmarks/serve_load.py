"""Load benchmark of the serving microservice on loopback: throughput and p50/p95/p99 latency at several
client concurrencies, with dynamic batching on and off, plus the raw artifact time at the same batch sizes.

Each configuration starts ``python -m service`` as its own process (torch threads pinned with
``--threads``) and drives it with an async httpx load generator bounded in requests and seconds.

    .venv/bin/python benchmarks/serve_load.py --repository model_repository --model fashion-vit \
        --concurrency 1 8 32 128 --requests 400 --seconds 60 --threads 1 --out docs/benchmarks.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(repository: Path, model: str, threads: int, extra: list[str]) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "service", "--host", "127.0.0.1", "--port", str(port), "--model-repository",
           str(repository), "--default-model", model, "--torch-threads", str(threads), "--poll-interval-s", "0",
           "--log-level", "warning", "--feedback-db", f"/tmp/director-bench-{port}.sqlite3", *extra]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=os.environ.copy())
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health/ready", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError("server did not become ready")


async def drive(url: str, body: dict[str, Any], concurrency: int, max_requests: int, max_seconds: float
                ) -> dict[str, Any]:
    latencies: list[float] = []
    codes: dict[int, int] = {}
    refused_latencies: list[float] = []
    issued = 0
    stop_at = time.monotonic() + max_seconds
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:

        async def worker() -> None:
            nonlocal issued
            while issued < max_requests and time.monotonic() < stop_at:
                issued += 1
                start = time.perf_counter()
                response = await client.post("/predict", json=body)
                elapsed = time.perf_counter() - start
                codes[response.status_code] = codes.get(response.status_code, 0) + 1
                (latencies if response.status_code == 200 else refused_latencies).append(elapsed)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - started
    ms = np.asarray(latencies) * 1000 if latencies else np.asarray([np.nan])
    return {"concurrency": concurrency, "ok": len(latencies), "codes": codes, "seconds": round(wall, 3),
            "throughput_rps": round(len(latencies) / wall, 2),
            "p50_ms": round(float(np.percentile(ms, 50)), 2), "p95_ms": round(float(np.percentile(ms, 95)), 2),
            "p99_ms": round(float(np.percentile(ms, 99)), 2),
            "refused_p99_ms": round(float(np.percentile(np.asarray(refused_latencies) * 1000, 99)), 2)
            if refused_latencies else None}


def raw_artifact(folder: Path, n_samples: int, batch_sizes: list[int], threads: int, repeats: int = 5
                 ) -> list[dict[str, Any]]:
    """Time of the artifact alone (``sample_rows``) per input at the same batch sizes."""
    torch.set_num_threads(threads)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning)
        module = torch.jit.load(str(folder / "director.ts"))
    manifest = json.loads((folder / "manifest.json").read_text())
    shape = (manifest["input"]["channels"], manifest["input"]["height"], manifest["input"]["width"])
    out = []
    with torch.inference_mode():
        for batch in batch_sizes:
            pixels = torch.rand(batch, *shape)
            counts = torch.full((batch,), n_samples, dtype=torch.long)
            module.sample_rows(pixels, counts)  # warm-up
            start = time.perf_counter()
            for _ in range(repeats):
                module.sample_rows(pixels, counts)
            seconds = (time.perf_counter() - start) / repeats
            out.append({"batch": batch, "ms_per_forward": round(seconds * 1000, 3),
                        "inputs_per_s": round(batch / seconds, 1)})
    return out


def write_markdown(results: dict[str, Any], path: Path) -> None:
    """The results table for docs/benchmarks.md (the analysis below it is written by hand)."""
    s = results["n_samples"]
    lines = [
        "# Serving benchmark (CPU, this machine)", "", "Command (one run measures both modes and the raw artifact):",
        "", "```bash", results["command"], "```", "",
        f"Model `{results['model']}`, one input per request, n_samples = {s}, torch {results['torch']}, "
        f"{results['cpu_count']} CPU cores. The server's torch threads are pinned to {results['threads']}; the async "
        "load generator runs on the same machine, on loopback. `batching`: `max_batch_samples` "
        f"{results['max_batch_samples']}, `max_batch_delay_ms` {results['max_batch_delay_ms']:g}. `batch-1`: "
        f"`max_batch_samples` {s} (one request per forward), no delay. Raw: `sample_rows` of the TorchScript "
        "artifact alone, same thread count.", "",
        "| clients | batching rps | p50 / p95 / p99 ms | batch-1 rps | p50 / p95 / p99 ms |",
        "| --- | --- | --- | --- | --- |",
    ]
    for a, b in zip(results["runs"]["batching"], results["runs"]["batch-1"], strict=True):
        lines.append(f"| {a['concurrency']} | {a['throughput_rps']} | {a['p50_ms']} / {a['p95_ms']} / {a['p99_ms']} "
                     f"| {b['throughput_rps']} | {b['p50_ms']} / {b['p95_ms']} / {b['p99_ms']} |")
    over = results.get("overload")
    if over is not None:
        lines += ["", f"Overload: {over['concurrency']} clients against `max_queue` {over['max_queue']}: status codes "
                  f"{over['codes']}, served p99 {over['p99_ms']} ms, refused p99 {over['refused_p99_ms']} ms."]
    lines += ["", "| raw artifact batch (inputs) | rows per forward | ms per forward | inputs/s |",
              "| --- | --- | --- | --- |"]
    lines += [f"| {x['batch']} | {x['batch'] * s} | {x['ms_per_forward']} | {x['inputs_per_s']} |"
              for x in results["raw_artifact"]]
    path.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repository", type=Path, default=ROOT / "model_repository")
    parser.add_argument("--model", default="fashion-vit")
    parser.add_argument("--version", default="1")
    parser.add_argument("--n-samples", type=int, default=16)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 128])
    parser.add_argument("--requests", type=int, default=400, help="requests per run (upper bound)")
    parser.add_argument("--seconds", type=float, default=60.0, help="seconds per run (upper bound)")
    parser.add_argument("--threads", type=int, default=1, help="server torch threads (pinned)")
    parser.add_argument("--max-batch-samples", type=int, default=128)
    parser.add_argument("--max-batch-delay-ms", type=float, default=0.0, help="batching window of the batching mode")
    parser.add_argument("--overload-clients", type=int, default=128)
    parser.add_argument("--overload-queue", type=int, default=12, help="max_queue of the overload run")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    parser.add_argument("--markdown", type=Path, default=None, help="write the results table as Markdown here")
    args = parser.parse_args(argv)

    folder = args.repository / args.model / args.version
    manifest = json.loads((folder / "manifest.json").read_text())
    shape = (manifest["input"]["channels"], manifest["input"]["height"], manifest["input"]["width"])
    pixels = np.random.default_rng(0).random(shape).round(4).tolist()
    body = {"inputs": [{"pixels": pixels}], "n_samples": args.n_samples, "return_probabilities": False}
    modes = {
        "batching": ["--max-batch-samples", str(args.max_batch_samples), "--max-batch-delay-ms",
                     str(args.max_batch_delay_ms)],
        "batch-1": ["--max-batch-samples", str(args.n_samples), "--max-batch-delay-ms", "0"],
    }
    results: dict[str, Any] = {
        "command": " ".join([".venv/bin/python", "benchmarks/serve_load.py", *sys.argv[1:]]),
        "threads": args.threads, "max_batch_samples": args.max_batch_samples,
        "max_batch_delay_ms": args.max_batch_delay_ms, "cpu_count": os.cpu_count(), "model": args.model,
        "torch": torch.__version__, "n_samples": args.n_samples, "runs": {},
    }
    for mode, extra in modes.items():
        proc, url = start_server(args.repository, args.model, args.threads, extra)
        try:
            runs = []
            for concurrency in args.concurrency:
                run = asyncio.run(drive(url, body, concurrency, args.requests, args.seconds))
                print(mode, json.dumps(run), flush=True)
                runs.append(run)
            results["runs"][mode] = runs
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
    # overload: a short queue and 128 clients, about 10x what the server absorbs; the excess must be refused fast
    proc, url = start_server(args.repository, args.model, args.threads,
                             [*modes["batching"], "--max-queue", str(args.overload_queue)])
    try:
        results["overload"] = asyncio.run(drive(url, body, args.overload_clients, args.requests * 4, args.seconds))
        results["overload"]["max_queue"] = args.overload_queue
        print("overload", json.dumps(results["overload"]), flush=True)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    results["raw_artifact"] = raw_artifact(folder, args.n_samples, [1, 8, 32, 128], args.threads)
    print("raw", json.dumps(results["raw_artifact"]))
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    if args.markdown is not None:
        write_markdown(results, args.markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
