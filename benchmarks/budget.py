"""What uncertainty costs: requests per second under a p99 latency budget, DIRECTOR at several sample
counts against the plain backbone exported as a deterministic artifact, both served by the same server.

Load model: open loop. Requests arrive as a Poisson process at a fixed rate whatever the server does, the
way independent users arrive, and each latency runs from the request's scheduled arrival (so a server, or a
generator, that falls behind pays for it). "The highest rate whose p99 stays under the budget" is then a
property of the server alone; with a closed loop (N clients back to back) the offered rate falls as latency
grows, and the answer would depend on N as much as on the server.

Search, per subject: start at half the rate one client achieves back to back, double until a point fails,
then bisect between the last passing and the first failing rate. A point passes when every request got 200
and the p99 over all of them is within the budget. Batching has room to help only where one request is a
small forward, so batching vs batch-1 is measured at S = 1 (plus peak throughput with 32 clients)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from loadgen import closed_loop, encode_post, open_loop
from report import repeated
from server import ROOT, running_server


@dataclass(frozen=True)
class Subject:
    label: str
    model: str
    method: str
    n_samples: int
    batching: str  # "batching" | "batch-1"


def passes(point: dict[str, Any], budget_ms: float) -> bool:
    codes = point["codes"]
    p99 = point["all_p99_ms"]
    return (not point["transport_errors"] and set(codes) == {"200"} and p99 is not None and p99 <= budget_ms)


def search(measure: Callable[[float], dict[str, Any]], start: float, budget_ms: float, steps: int,
           max_points: int = 16, floor: float = 0.5) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """The best passing point (highest rate) and every point tried, in order."""
    points: list[dict[str, Any]] = []

    def probe(rate: float) -> dict[str, Any]:
        point = measure(rate)
        point["pass"] = passes(point, budget_ms)
        points.append(point)
        print(f"  {rate:8.1f} rps offered: p99 {point['all_p99_ms']} ms, codes {point['codes']}, "
              f"{'pass' if point['pass'] else 'fail'}", flush=True)
        return point

    best: dict[str, Any] | None = None
    failed: float | None = None
    rate = start
    while len(points) < max_points:  # bracket: double up from a pass, or halve down from a fail
        point = probe(rate)
        if point["pass"]:
            best = point
            if failed is not None:
                break
            rate *= 2
        else:
            failed = rate
            if best is not None or rate / 2 < floor:
                break
            rate /= 2
    for _ in range(steps):
        if best is None or failed is None or len(points) >= max_points:
            break
        point = probe(round((best["offered_rps"] + failed) / 2, 2))
        if point["pass"]:
            best = point
        else:
            failed = point["offered_rps"]
    return best, points


def export_deterministic(config: str, repository: Path) -> None:
    """The pipeline's own exporter (a subprocess: the benchmark does not import training code)."""
    cmd = [sys.executable, "-m", "training", "export-baseline", "--config", config, "--method", "deterministic",
           "--repository", str(repository)]
    print("exporting the deterministic artifact:", " ".join(cmd), flush=True)
    proc = subprocess.Popen(cmd, cwd=ROOT, start_new_session=True)
    try:
        if proc.wait(timeout=1800) != 0:
            raise RuntimeError(f"export-baseline failed with {proc.returncode}")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def prepare_repository(director_model: Path, deterministic: Path | None, config: str, target: Path
                       ) -> tuple[str, str]:
    """``target`` with the DIRECTOR model (every version) and a deterministic artifact; returns both names."""
    target.mkdir(parents=True)
    shutil.copytree(director_model, target / director_model.name)
    if deterministic is None:
        export_deterministic(config, target)
    else:
        manifest = json.loads((deterministic / "manifest.json").read_text())
        shutil.copytree(deterministic, target / manifest["name"] / str(manifest["version"]))
    names = {}
    for manifest_path in sorted(target.glob("*/*/manifest.json")):
        manifest = json.loads(manifest_path.read_text())
        names.setdefault(manifest.get("method", "director"), manifest_path.parent.parent.name)
    if "deterministic" not in names:
        raise RuntimeError(f"no deterministic artifact in {target}")
    return director_model.name, names["deterministic"]


def body_for(shape: tuple[int, int, int], model: str, n_samples: int) -> dict[str, Any]:
    pixels = np.random.default_rng(0).random(shape).round(4).tolist()
    return {"model": model, "inputs": [{"pixels": pixels}], "n_samples": n_samples, "return_probabilities": False}


def measure_subject(url: str, subject: Subject, shape: tuple[int, int, int], budget_ms: float, seconds: float,
                    steps: int) -> dict[str, Any]:
    raw = encode_post(url, "/predict", body_for(shape, subject.model, subject.n_samples))
    asyncio.run(closed_loop(url, raw, 16, 10_000, min(2.0, seconds)))  # warm-up: shapes, caches, allocator
    one = asyncio.run(closed_loop(url, raw, 1, 10_000, min(2.0, seconds)))
    start = max(1.0, round(500.0 / one["p50_ms"], 1)) if one["p50_ms"] else 1.0

    def measure(rate: float) -> dict[str, Any]:
        point = asyncio.run(open_loop(url, raw, rate, seconds))
        time.sleep(0.5)  # let the server settle between points
        return point

    print(f"{subject.label} S={subject.n_samples} ({subject.batching}): search from {start} rps", flush=True)
    best, points = search(measure, start, budget_ms, steps)
    row: dict[str, Any] = {**asdict(subject), "one_client_p50_ms": one["p50_ms"], "points": points}
    if best is not None:
        row.update({"max_rps": best["offered_rps"], "throughput_rps": best["throughput_rps"],
                    "p50_ms": best["all_p50_ms"], "p95_ms": best["all_p95_ms"], "p99_ms": best["all_p99_ms"]})
    else:
        row["max_rps"] = None
    return row


def run_budget(repository: Path, model: str, deterministic: Path | None, config: str, threads: int,
               samples: list[int], max_batch_samples: int, budget_ms: float, seconds: float, steps: int,
               peak_clients: int, peak_requests: int, server_args: list[str] | None = None,
               repeats: int = 1) -> dict[str, Any]:
    """``server_args`` go to every server started (e.g. ``--device cuda --bf16``). With ``repeats`` > 1 every search
    runs that many times, a fresh server per mode and repeat, the subjects' order reversed every other repeat; the
    rows carry their repeat and ``repeated`` summarises them."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="director-budget-") as tmp:
        repo = Path(tmp) / "repository"
        director, plain = prepare_repository(repository / model, deterministic, config, repo)
        manifest = json.loads(next((repo / director).glob("*/manifest.json")).read_text())
        shape = (manifest["input"]["channels"], manifest["input"]["height"], manifest["input"]["width"])
        servers = {
            "batching": (["--max-batch-samples", str(max_batch_samples), "--max-batch-delay-ms", "0"],
                         [Subject("DIRECTOR", director, "director", s, "batching") for s in samples]
                         + [Subject("deterministic", plain, "deterministic", 1, "batching")]),
            "batch-1": (["--max-batch-samples", "1", "--max-batch-delay-ms", "0"],
                        [Subject("DIRECTOR", director, "director", 1, "batch-1"),
                         Subject("deterministic", plain, "deterministic", 1, "batch-1")]),
        }
        rows: list[dict[str, Any]] = []
        peak: list[dict[str, Any]] = []
        for repeat in range(repeats):
            for mode, (extra, subjects) in servers.items():
                # a queue long enough that the search meets the latency budget, never a refusal
                with running_server(repo, director, threads,
                                    [*extra, "--max-queue", "4096", *(server_args or [])]) as url:
                    for subject in (subjects if repeat % 2 == 0 else subjects[::-1]):
                        rows.append({**measure_subject(url, subject, shape, budget_ms, seconds, steps),
                                     "repeat": repeat})
                    raw = encode_post(url, "/predict", body_for(shape, director, 1))
                    result = asyncio.run(closed_loop(url, raw, peak_clients, peak_requests, max(seconds, 5.0)))
                    result.update({"label": "DIRECTOR", "n_samples": 1, "batching": mode, "repeat": repeat})
                    print("peak", mode, json.dumps(result), flush=True)
                    peak.append(result)
    return {"budget_ms": budget_ms, "point_seconds": seconds, "search_steps": steps, "threads": threads,
            "max_batch_samples": max_batch_samples, "models": {"director": director, "deterministic": plain},
            "director_version": max((v.name for v in (repository / model).iterdir() if v.name.isdigit()), key=int),
            "rows": rows, "peak": peak, "peak_clients": peak_clients, "repeats": repeats,
            "repeated": repeated(rows)}
