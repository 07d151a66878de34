"""What uncertainty costs: requests per second under a p99 latency budget, DIRECTOR at several sample
counts against the plain backbone exported as a deterministic artifact, both served by the same server.

Load model: open loop. Requests arrive as a Poisson process at a fixed rate whatever the server does, the
way independent users arrive, and each latency runs from the request's scheduled arrival (so a server, or a
generator, that falls behind pays for it). "The highest rate whose p99 stays under the budget" is then a
property of the server alone; with a closed loop (N clients back to back) the offered rate falls as latency
grows, and the answer would depend on N as much as on the server.

Search, per subject: start at half the rate one client achieves back to back, double until a point fails,
then bisect between the last passing and the first failing rate. A point passes when every request got 200
and the p99 over all of them is within the budget. The subjects one server serves are searched point by point in
turn (DIRECTOR's next point, then the deterministic model's, ...), not one whole search after the other, so that
the machine's slow and fast minutes fall on every subject alike and their ratio, paired within a repeat, is steadier
than the rates. Batching has room to help only where one request is a small forward, so batching vs batch-1 is
measured at S = 1 (plus peak throughput with 32 clients)."""

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


class RateSearch:
    """One subject's search, a point at a time: ``next_rate`` is the rate to offer next (None once done) and
    ``record`` takes that point's result. Bracket (double up from a pass, halve down from a fail), then bisect
    ``steps`` times between the best passing and the lowest failing rate."""

    def __init__(self, start: float, budget_ms: float, steps: int, max_points: int = 16, floor: float = 0.5
                 ) -> None:
        self.budget_ms, self.steps_left, self.max_points, self.floor = budget_ms, steps, max_points, floor
        self.points: list[dict[str, Any]] = []
        self.best: dict[str, Any] | None = None
        self.failed: float | None = None
        self.bracketed = False
        self.next_rate: float | None = start

    def record(self, point: dict[str, Any]) -> None:
        """``point`` (an open-loop run at ``next_rate``) gets its verdict under ``pass`` and sets the next rate."""
        rate = self.next_rate
        assert rate is not None, "the search is done"
        point["pass"] = passes(point, self.budget_ms)
        self.points.append(point)
        if point["pass"]:
            self.best = point
        else:  # bracketing keeps the rate asked for; a bisection point, the rate its arrivals made
            self.failed = point["offered_rps"] if self.bracketed else rate
        if not self.bracketed:
            if point["pass"] and self.failed is None:
                self.next_rate = rate * 2
            elif not point["pass"] and self.best is None and rate / 2 >= self.floor:
                self.next_rate = rate / 2
            else:
                self.bracketed = True
        else:
            self.steps_left -= 1
        if self.bracketed:
            done = self.best is None or self.failed is None or self.steps_left <= 0
            self.next_rate = None if done else round((self.best["offered_rps"] + self.failed) / 2, 2)
        if len(self.points) >= self.max_points:
            self.next_rate = None


def interleaved(searches: list[tuple[str, RateSearch, Callable[[float], dict[str, Any]]]]) -> None:
    """Run every (label, search, measure) to its end, one point of each in turn."""
    while any(search.next_rate is not None for _, search, _ in searches):
        for label, search, measure in searches:
            rate = search.next_rate
            if rate is None:
                continue
            point = measure(rate)
            search.record(point)
            print(f"  {label}: {rate:8.1f} rps offered: p99 {point['all_p99_ms']} ms, codes {point['codes']}, "
                  f"{'pass' if point['pass'] else 'fail'}", flush=True)


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


# a text model's request: one review-like sentence, 20 tokens with [CLS] and [SEP] (the default text task's test
# sentences: median 26)
SENTENCE = "a gripping , funny and ultimately moving film that never forgets the people at its heart ."


def body_for(manifest: dict[str, Any], model: str, n_samples: int) -> dict[str, Any]:
    """One input of the model's modality (the manifest's ``modality`` and ``input``): seeded random pixels of its
    shape, or ``SENTENCE``."""
    if manifest.get("modality") == "text":
        item: dict[str, Any] = {"text": SENTENCE}
    else:
        shape = (manifest["input"]["channels"], manifest["input"]["height"], manifest["input"]["width"])
        item = {"pixels": np.random.default_rng(0).random(shape).round(4).tolist()}
    return {"model": model, "inputs": [item], "n_samples": n_samples, "return_probabilities": False}


@dataclass
class SubjectSearch:
    """A subject ready to be searched on a running server: its request, its start rate and its search."""

    subject: Subject
    raw: bytes
    one_client_p50_ms: float | None
    search: RateSearch

    @property
    def label(self) -> str:
        return f"{self.subject.label} S={self.subject.n_samples} ({self.subject.batching})"

    def row(self) -> dict[str, Any]:
        row: dict[str, Any] = {**asdict(self.subject), "one_client_p50_ms": self.one_client_p50_ms,
                               "points": self.search.points}
        best = self.search.best
        if best is None:
            return {**row, "max_rps": None}
        return {**row, "max_rps": best["offered_rps"], "throughput_rps": best["throughput_rps"],
                "p50_ms": best["all_p50_ms"], "p95_ms": best["all_p95_ms"], "p99_ms": best["all_p99_ms"]}


def prepare_subject(url: str, subject: Subject, manifest: dict[str, Any], budget_ms: float, seconds: float,
                    steps: int) -> SubjectSearch:
    """Warm the subject up (shapes, caches, allocator) and start its search at half one client's rate."""
    raw = encode_post(url, "/predict", body_for(manifest, subject.model, subject.n_samples))
    asyncio.run(closed_loop(url, raw, 16, 10_000, min(2.0, seconds)))
    one = asyncio.run(closed_loop(url, raw, 1, 10_000, min(2.0, seconds)))
    start = max(1.0, round(500.0 / one["p50_ms"], 1)) if one["p50_ms"] else 1.0
    prepared = SubjectSearch(subject, raw, one["p50_ms"], RateSearch(start, budget_ms, steps))
    print(f"{prepared.label}: search from {start} rps", flush=True)
    return prepared


def search_subjects(url: str, subjects: list[Subject], manifest: dict[str, Any], budget_ms: float,
                    seconds: float, steps: int) -> list[dict[str, Any]]:
    """Every subject's search on the server at ``url``, point by point in turn (``interleaved``); a row each."""
    prepared = [prepare_subject(url, subject, manifest, budget_ms, seconds, steps) for subject in subjects]

    def measure_for(raw: bytes) -> Callable[[float], dict[str, Any]]:
        def measure(rate: float) -> dict[str, Any]:
            point = asyncio.run(open_loop(url, raw, rate, seconds))
            time.sleep(0.5)  # let the server settle between points
            return point

        return measure

    interleaved([(p.label, p.search, measure_for(p.raw)) for p in prepared])
    return [p.row() for p in prepared]


def run_budget(repository: Path, model: str, deterministic: Path | None, config: str, threads: int,
               samples: list[int], max_batch_samples: int, budget_ms: float, seconds: float, steps: int,
               peak_clients: int, peak_requests: int, server_args: list[str] | None = None,
               repeats: int = 1) -> dict[str, Any]:
    """``server_args`` go to every server started (e.g. ``--device cuda --bf16``). With ``repeats`` > 1 every search
    runs that many times, a fresh server per mode and repeat, the subjects' turn order reversed every other repeat;
    the rows carry their repeat and ``repeated`` summarises them."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="director-budget-") as tmp:
        repo = Path(tmp) / "repository"
        director, plain = prepare_repository(repository / model, deterministic, config, repo)
        manifest = json.loads(next((repo / director).glob("*/manifest.json")).read_text())
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
                    order = subjects if repeat % 2 == 0 else subjects[::-1]
                    rows += [{**row, "repeat": repeat}
                             for row in search_subjects(url, order, manifest, budget_ms, seconds, steps)]
                    raw = encode_post(url, "/predict", body_for(manifest, director, 1))
                    result = asyncio.run(closed_loop(url, raw, peak_clients, peak_requests, max(seconds, 5.0)))
                    result.update({"label": "DIRECTOR", "n_samples": 1, "batching": mode, "repeat": repeat})
                    print("peak", mode, json.dumps(result), flush=True)
                    peak.append(result)
    return {"budget_ms": budget_ms, "point_seconds": seconds, "search_steps": steps, "search": "interleaved",
            "threads": threads,
            "max_batch_samples": max_batch_samples, "models": {"director": director, "deterministic": plain},
            "director_version": max((v.name for v in (repository / model).iterdir() if v.name.isdigit()), key=int),
            "rows": rows, "peak": peak, "peak_clients": peak_clients, "repeats": repeats,
            "repeated": repeated(rows)}
