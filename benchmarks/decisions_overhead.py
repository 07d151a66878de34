"""What a request's `coverage` and `max_risk` cost the server: its own time per request (the response's
``timings.total_ms``, decoding to the response body) and the client's round trip, for the same image at S = 1 with and
without each ask, interleaved request by request so the machine's drift hits every variant alike.

    .venv/bin/python -m benchmarks.decisions_overhead --rounds 3 --requests 300 \\
        --out docs/benchmarks-decisions.json --markdown docs/benchmarks-decisions.md

One server (``python -m service``, torch pinned to ``--threads``) on a repository holding only ``--model`` /
``--version`` of this checkout; one client sends one request at a time (no batching between requests), one image as
a JSON pixel list, ``return_probabilities`` false. Per round and variant the median of each time; the overhead is the
variant's median over the plain request's, minus 1, per round; the page gives the median and range over rounds.

Beside it, per round, the paired overhead: the median over the round's request groups of the variant's server time
minus the plain request's sent just before it, over the plain request's median. On a machine other jobs share, the
load moves every request of a round; a pair of requests a few milliseconds apart sees nearly the same load, so this
one moves far less from round to round. The page also gives the load average at the start and the end, and the
decision work alone (``VersionDecisions.decide`` on one input, timed in this process), which no load can hide.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from datetime import date
from pathlib import Path
from typing import Any

import httpx
import torch
from tqdm import tqdm

from benchmarks.report import write_keeping_analysis
from benchmarks.server import ROOT, running_server
from service.engine.artifact import read_manifest, validate_manifest
from service.engine.decisions import DecisionRequest, VersionDecisions

VARIANTS: dict[str, dict[str, Any]] = {
    "plain": {},
    "coverage": {"coverage": 0.9},
    "max_risk": {"max_risk": 0.05},
    "both": {"coverage": 0.9, "max_risk": 0.05},
}
TARGET = 0.05  # the overhead allowed: 5% of a request's server time at S = 1


def measure_round(client: httpx.Client, url: str, body: dict[str, Any], requests: int) -> dict[str, dict[str, float]]:
    """``requests`` requests of each variant, interleaved; per variant the median server and round-trip ms, and the
    median of its server ms minus the plain request's of the same group (``paired_ms``)."""
    server: dict[str, list[float]] = {name: [] for name in VARIANTS}
    trip: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for _ in range(requests):
        for name, ask in VARIANTS.items():
            started = time.perf_counter()
            response = client.post(f"{url}/predict", json={**body, **ask})
            trip[name].append((time.perf_counter() - started) * 1000)
            if response.status_code != 200:
                raise RuntimeError(f"{name}: {response.status_code} {response.text[:300]}")
            server[name].append(response.json()["timings"]["total_ms"])
    return {name: {"server_ms": statistics.median(server[name]), "round_trip_ms": statistics.median(trip[name]),
                   "paired_ms": statistics.median(v - p for v, p in zip(server[name], server["plain"], strict=True))}
            for name in VARIANTS}


def overheads(rounds: list[dict[str, dict[str, float]]], figure: str) -> dict[str, dict[str, float]]:
    """Per asking variant: its time over the plain request's, minus 1, per round; median and range."""
    return _spread(rounds, lambda r, name: r[name][figure] / r["plain"][figure] - 1)


def paired_overheads(rounds: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Per asking variant: its paired difference over the plain request's median server time, per round; median
    and range."""
    return _spread(rounds, lambda r, name: r[name]["paired_ms"] / r["plain"]["server_ms"])


def _spread(rounds: list[dict[str, dict[str, float]]], figure: Any) -> dict[str, dict[str, float]]:
    out = {}
    for name in (v for v in VARIANTS if v != "plain"):
        values = [figure(r, name) for r in rounds]
        out[name] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
    return out


def decide_us(model: str, version: str, repeats: int = 2000) -> dict[str, float]:
    """Per asking variant, ``VersionDecisions.decide`` on one input (random probabilities) alone: microseconds per
    call, the best of five runs of ``repeats`` calls."""
    folder = ROOT / "model_repository" / model / version
    manifest = validate_manifest(read_manifest(folder))
    decisions = VersionDecisions.load(folder, manifest)
    if decisions is None:
        raise SystemExit(f"{model} version {version} has no conformal part")
    probs = torch.softmax(torch.randn(1, len(manifest.labels)) * 3, dim=1)
    out = {}
    for name, ask in VARIANTS.items():
        if name == "plain":
            continue
        request = DecisionRequest(ask.get("coverage"), ask.get("max_risk"))
        runs = []
        for _ in range(5):
            started = time.perf_counter()
            for _ in range(repeats):
                decisions.decide(probs, [False], request)
            runs.append((time.perf_counter() - started) / repeats * 1e6)
        out[name] = min(runs)
    return out


def markdown(results: dict[str, Any]) -> list[str]:
    lines = ["# Cost of prediction sets and abstentions per request", "",
             f"Measured {results['date']} by `{results['command']}`: model `{results['model']}` version "
             f"{results['version']}, S = 1, one image per request as a JSON pixel list, one client, one request at a "
             f"time; server torch threads {results['threads']}, 2 CPU cores shared by the server and the client; "
             f"{results['rounds']} rounds of {results['requests']} requests per variant, interleaved. Load average "
             f"(1 min) {results['load'][0]:.2f} at the start, {results['load'][1]:.2f} at the end.", "",
             "| variant | server ms (median of rounds) | round trip ms | server overhead vs plain, median [range] | "
             "paired server overhead, median [range] | round-trip overhead | decide alone, us |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for name, ask in VARIANTS.items():
        server = statistics.median(r[name]["server_ms"] for r in results["per_round"])
        trip = statistics.median(r[name]["round_trip_ms"] for r in results["per_round"])
        if name == "plain":
            lines.append(f"| plain | {server:.2f} | {trip:.2f} | - | - | - | - |")
            continue
        s, p = results["server_overhead"][name], results["paired_server_overhead"][name]
        t = results["round_trip_overhead"][name]
        lines.append(f"| {json.dumps(ask)} | {server:.2f} | {trip:.2f} | {_range(s)} | {_range(p)} | "
                     f"{100 * t['median']:+.1f}% | {results['decide_us'][name]:.1f} |")
    worst = max(v["median"] for v in results["server_overhead"].values())
    paired = max(v["median"] for v in results["paired_server_overhead"].values())
    lines += ["", f"Target: at most {TARGET:.0%} of a request's server time. Worst median here: {100 * paired:+.1f}% "
              f"paired ({'met' if paired <= TARGET else 'not met'}), {100 * worst:+.1f}% as a ratio of medians "
              f"({'met' if worst <= TARGET else 'not met'})."]
    return lines


def _range(figure: dict[str, float]) -> str:
    return f"{100 * figure['median']:+.1f}% [{100 * figure['min']:+.1f}, {100 * figure['max']:+.1f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="fashion-vit")
    parser.add_argument("--version", default="9")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=300, help="requests per variant and round")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks-decisions.json")
    parser.add_argument("--markdown", type=Path, default=ROOT / "docs" / "benchmarks-decisions.md")
    args = parser.parse_args()
    torch.manual_seed(0)
    body = {"inputs": [{"pixels": torch.rand(1, 28, 28).tolist()}], "n_samples": 1, "return_probabilities": False}
    per_round = []
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="decisions-bench-") as tmp:
        repository = Path(tmp) / "repo"
        shutil.copytree(ROOT / "model_repository" / args.model / args.version, repository / args.model / args.version)
        with running_server(repository, args.model, args.threads, []) as url, httpx.Client(timeout=60) as client:
            measure_round(client, url, body, 20)  # warm-up
            for _ in tqdm(range(args.rounds), desc="rounds"):
                per_round.append(measure_round(client, url, body, args.requests))
    command = ("python -m benchmarks.decisions_overhead --rounds " f"{args.rounds} --requests {args.requests}")
    results = {"date": date.today().isoformat(), "command": command, "model": args.model, "version": args.version,
               "threads": args.threads, "rounds": args.rounds, "requests": args.requests,
               "load": [load_start, os.getloadavg()[0]], "per_round": per_round,
               "server_overhead": overheads(per_round, "server_ms"),
               "paired_server_overhead": paired_overheads(per_round),
               "round_trip_overhead": overheads(per_round, "round_trip_ms"),
               "decide_us": decide_us(args.model, args.version)}
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    write_keeping_analysis(args.markdown, markdown(results))
    print("\n".join(markdown(results)))


if __name__ == "__main__":
    main()
