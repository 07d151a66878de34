"""Goodput under costly concurrent requests: answered inputs per second within the request timeout, when N clients each
send one request that runs as many batch-sized parts, all at once. The sequential rate (one such request at a time,
measured first in the same run) is the baseline; a server that admits everything runs the parts interleaved, and past
the point where the queue's work exceeds the timeout every request finishes late (504) and goodput falls to 0. The
server's work budget (``service.engine.batching.worker``: refuse at once what the queue could not finish in time)
should hold goodput near the sequential rate at any N.

    .venv/bin/python -m benchmarks.goodput --model movie-reviews-minilm --clients 1 5 10 20 40 \\
        --out docs/benchmarks-goodput.json --markdown docs/benchmarks-goodput.md

Text models get 64 movie-review test sentences per request, image models 64 seeded random images; every request asks
for ``--n-samples`` samples.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from datetime import date
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from benchmarks.report import store_entry
from benchmarks.server import ROOT, running_server


def request_body(model: str, inputs: int, n_samples: int, text: bool) -> dict[str, Any]:
    if text:
        from training.data.texts import load_movie_reviews

        sentences = load_movie_reviews(val_size=1000, split_seed=0).test.texts[:inputs]
        items: list[dict[str, Any]] = [{"text": t} for t in sentences]
    else:
        pixels = np.random.default_rng(0).random((inputs, 28, 28)).round(3)
        items = [{"pixels": image.tolist()} for image in pixels]
    return {"model": model, "inputs": items, "n_samples": n_samples}


async def burst(url: str, body: dict[str, Any], clients: int, timeout_s: float) -> dict[str, Any]:
    """``clients`` requests at once: how each was answered, and answered inputs per second of the burst's wall time."""
    async with httpx.AsyncClient(base_url=url, timeout=timeout_s + 30) as client:
        started = time.perf_counter()
        responses = await asyncio.gather(*(client.post("/predict", json=body) for _ in range(clients)))
        wall = time.perf_counter() - started
    codes = [r.status_code for r in responses]
    answered = sum(len(body["inputs"]) for r in responses if r.status_code == 200)
    return {"clients": clients, "codes": {str(c): codes.count(c) for c in sorted(set(codes))},
            "answered_inputs": answered, "wall_s": round(wall, 2), "goodput_inputs_per_s": round(answered / wall, 2)}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    text = args.model != "fashion-vit"
    body = request_body(args.model, args.inputs, args.n_samples, text)
    extra = ["--request-timeout-s", str(args.timeout_s), "--max-queue", "256"]
    with running_server(args.repository, args.model, args.threads, extra) as url:
        httpx.post(f"{url}/predict", json=body, timeout=args.timeout_s + 30)  # warm, and the worker's rate
        started = time.perf_counter()
        for _ in range(args.sequential):
            response = httpx.post(f"{url}/predict", json=body, timeout=args.timeout_s + 30)
            response.raise_for_status()
        sequential = args.sequential * args.inputs / (time.perf_counter() - started)
        points = []
        for clients in args.clients:
            point = asyncio.run(burst(url, body, clients, args.timeout_s))
            point["vs_sequential"] = round(point["goodput_inputs_per_s"] / sequential, 2)
            print(point, flush=True)
            points.append(point)
    return {"model": args.model, "inputs": args.inputs, "n_samples": args.n_samples, "timeout_s": args.timeout_s,
            "threads": args.threads, "date": date.today().isoformat(),
            "sequential_inputs_per_s": round(sequential, 2), "points": points,
            "command": "python -m benchmarks.goodput " + " ".join(args.argv)}


def section(results: dict[str, Any]) -> list[str]:
    lines = [f"## {results['model']}", "", "```bash", results["command"], "```", "",
             f"{results['inputs']} inputs x {results['n_samples']} samples per request, request timeout "
             f"{results['timeout_s']:g} s, {results['threads']} torch thread(s), {results['date']}. One request at a "
             f"time: **{results['sequential_inputs_per_s']:g} inputs/s**. Goodput: inputs answered (200) per second of "
             "the burst, all clients sending at once.", "",
             "| clients | answered | refused (503) | timed out (504) | wall (s) | goodput (inputs/s) | vs sequential |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for point in results["points"]:
        codes = point["codes"]
        lines.append(f"| {point['clients']} | {codes.get('200', 0)} | {codes.get('503', 0)} | {codes.get('504', 0)} | "
                     f"{point['wall_s']:g} | {point['goodput_inputs_per_s']:g} | {point['vs_sequential']:.2f}x |")
    return lines


def main(argv: list[str] | None = None) -> int:
    import sys

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repository", type=Path, default=ROOT / "model_repository")
    parser.add_argument("--model", default="movie-reviews-minilm")
    parser.add_argument("--inputs", type=int, default=64)
    parser.add_argument("--n-samples", type=int, default=4)
    parser.add_argument("--timeout-s", type=float, default=30.0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--sequential", type=int, default=3, help="requests one after another for the baseline")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 5, 10, 20, 40])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args(argv)
    args.argv = list(argv if argv is not None else sys.argv[1:])
    results = measure(args)
    if args.out is not None:
        store_entry(args.out, args.markdown, args.model, results, "# Goodput under costly concurrent requests",
                    section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
