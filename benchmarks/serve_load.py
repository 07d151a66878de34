"""Load benchmark of the serving microservice on loopback.

Modes (``--mode``):

- ``load`` (the default): throughput and p50/p95/p99 latency at several client concurrencies with dynamic
  batching on and off (closed loop, httpx clients), the raw artifact time at the same batch sizes, and
  overload: open-loop arrivals at ``--overload-factor`` x the capacity just measured against a short queue
  (the excess must be refused fast, with 503 only), plus a flood of ``--overload-clients`` back-to-back
  clients.
- ``budget``: requests per second under a ``--budget-ms`` p99 budget for DIRECTOR at ``--budget-samples``
  against the plain backbone exported as a deterministic artifact, served by the same server, and batching
  vs batch-1 at S = 1 (see ``budget.py``).
- ``all``: both.

Each configuration starts ``python -m service`` as its own process group (torch threads pinned with
``--threads``). ``--out`` merges this run's results into the JSON file (other sections are kept) and
``--markdown`` rewrites the tables of the Markdown file, keeping its hand-written analysis.

    .venv/bin/python benchmarks/serve_load.py --mode all --requests 200 --seconds 30 --threads 1 \
        --out docs/benchmarks.json --markdown docs/benchmarks.md

On a GPU host, once with fp32 and once with ``--bf16`` (the server and the raw artifact on the GPU; rows per
forward raised, since a forward of 128 rows leaves a GPU mostly idle):

    .venv/bin/python benchmarks/serve_load.py --mode all --device cuda --max-batch-samples 2048 --threads 4 \
        --out docs/benchmarks-gpu.json --markdown docs/benchmarks-gpu.md
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import torch
from budget import run_budget
from loadgen import closed_loop, encode_post, open_loop
from report import write_markdown
from server import ROOT, running_server
from timing import raw_forward


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


def server_device_args(args: argparse.Namespace) -> list[str]:
    return ["--device", args.device, *(["--bf16"] if args.bf16 else [])]


def run_load(args: argparse.Namespace, results: dict[str, Any]) -> None:
    folder = args.repository / args.model / args.version
    manifest = json.loads((folder / "manifest.json").read_text())
    shape = (manifest["input"]["channels"], manifest["input"]["height"], manifest["input"]["width"])
    pixels = np.random.default_rng(0).random(shape).round(4).tolist()
    body = {"inputs": [{"pixels": pixels}], "n_samples": args.n_samples, "return_probabilities": False}
    device = server_device_args(args)
    modes = {
        "batching": ["--max-batch-samples", str(args.max_batch_samples), "--max-batch-delay-ms",
                     str(args.max_batch_delay_ms), *device],
        "batch-1": ["--max-batch-samples", str(args.n_samples), "--max-batch-delay-ms", "0", *device],
    }
    results.update({
        "command": results["invocation"], "threads": args.threads, "max_batch_samples": args.max_batch_samples,
        "max_batch_delay_ms": args.max_batch_delay_ms, "cpu_count": os.cpu_count(), "model": args.model,
        "torch": torch.__version__, "n_samples": args.n_samples, "runs": {}, "device": args.device, "bf16": args.bf16,
    })
    for mode, extra in modes.items():
        with running_server(args.repository, args.model, args.threads, extra) as url:
            runs = []
            for concurrency in args.concurrency:
                run = asyncio.run(drive(url, body, concurrency, args.requests, args.seconds))
                print(mode, json.dumps(run), flush=True)
                runs.append(run)
            results["runs"][mode] = runs
    # overload: a short queue, and arrivals at a multiple of what the server just sustained. The lean
    # generator (loadgen) is used here: httpx cannot offer ~10x capacity on these cores without becoming the
    # bottleneck whose latency it would then report.
    capacity = max(run["throughput_rps"] for run in results["runs"]["batching"])
    offered = round(capacity * args.overload_factor, 1)
    with running_server(args.repository, args.model, args.threads,
                        [*modes["batching"], "--max-queue", str(args.overload_queue)]) as url:
        raw = encode_post(url, "/predict", body)
        over = asyncio.run(open_loop(url, raw, offered, args.overload_seconds))
        over.update({"max_queue": args.overload_queue, "capacity_rps": capacity, "factor": args.overload_factor})
        results["overload"] = over
        print("overload", json.dumps(over), flush=True)
        flood = asyncio.run(closed_loop(url, raw, args.overload_clients, args.requests * 4, args.seconds))
        flood["max_queue"] = args.overload_queue
        results["flood"] = flood
        print("flood", json.dumps(flood), flush=True)
    # S = 1 too: the ceiling of what batching can gain where a request is one row (budget mode's peak runs)
    results["raw_artifact"] = [row for s in sorted({args.n_samples, 1}, reverse=True)
                               for row in raw_forward(folder, s, [1, 8, 32, 128], args.threads, device=args.device,
                                                       bf16=args.bf16)]
    print("raw", json.dumps(results["raw_artifact"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=["load", "budget", "all"], default="load")
    parser.add_argument("--repository", type=Path, default=ROOT / "model_repository")
    parser.add_argument("--model", default="fashion-vit")
    parser.add_argument("--version", default="1")
    parser.add_argument("--n-samples", type=int, default=16)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 128])
    parser.add_argument("--requests", type=int, default=400, help="requests per run (upper bound)")
    parser.add_argument("--seconds", type=float, default=60.0, help="seconds per run (upper bound)")
    parser.add_argument("--threads", type=int, default=1, help="server torch threads (pinned)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="server and raw artifact device")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast on CUDA (server and raw artifact)")
    parser.add_argument("--max-batch-samples", type=int, default=128, help="rows per forward (raise it on a GPU)")
    parser.add_argument("--max-batch-delay-ms", type=float, default=0.0, help="batching window of the batching mode")
    parser.add_argument("--overload-factor", type=float, default=10.0, help="overload arrival rate / capacity")
    parser.add_argument("--overload-seconds", type=float, default=10.0, help="length of the overload run")
    parser.add_argument("--overload-clients", type=int, default=128, help="clients of the closed-loop flood")
    parser.add_argument("--overload-queue", type=int, default=12, help="max_queue of the overload runs")
    parser.add_argument("--budget-ms", type=float, default=50.0, help="budget mode: p99 latency budget")
    parser.add_argument("--budget-samples", type=int, nargs="+", default=[1, 4, 16], help="budget mode: DIRECTOR S")
    parser.add_argument("--point-seconds", type=float, default=10.0, help="budget mode: seconds per offered rate")
    parser.add_argument("--search-steps", type=int, default=4, help="budget mode: bisection steps")
    parser.add_argument("--repeats", type=int, default=1, help="budget mode: searches per subject (median, range)")
    parser.add_argument("--peak-clients", type=int, default=32, help="budget mode: clients of the S=1 peak run")
    parser.add_argument("--deterministic", type=Path, default=None,
                        help="budget mode: an exported deterministic artifact version folder (default: export one "
                             "with python -m training export-baseline into the temporary repository)")
    parser.add_argument("--config", default="configs/fashion_vit.yaml", help="budget mode: config of the export")
    parser.add_argument("--out", type=Path, default=None, help="merge the results into this JSON file")
    parser.add_argument("--markdown", type=Path, default=None, help="rewrite the tables of this Markdown file")
    args = parser.parse_args(argv)

    invocation = " ".join([".venv/bin/python", "benchmarks/serve_load.py", *(sys.argv[1:] if argv is None else argv)])
    results: dict[str, Any] = {}
    if args.out is not None and args.out.exists():
        results = json.loads(args.out.read_text())  # sections this run does not measure are kept
    results["invocation"] = invocation
    if args.mode in ("load", "all"):
        run_load(args, results)
    if args.mode in ("budget", "all"):
        results["budget"] = run_budget(
            args.repository, args.model, args.deterministic, args.config, args.threads, args.budget_samples,
            args.max_batch_samples, args.budget_ms, args.point_seconds, args.search_steps, args.peak_clients,
            args.requests * 4, server_device_args(args), args.repeats)
        results["budget"].update({"command": invocation, "torch": torch.__version__, "cpu_count": os.cpu_count(),
                                  "device": args.device, "bf16": args.bf16})
    results.pop("invocation")
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    if args.markdown is not None:
        write_markdown(results, args.markdown, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
