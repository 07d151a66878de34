"""The overhead page's figures from a run's raw results: overhead per round against that round's own raw forward,
paired ratios against the first tree, the server's CPU beyond the forward; and the budget search's repeats summarised
with ratios paired by repeat."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.overhead import markdown, summarise, worker_figures, worker_totals_of
from service.observability.metrics import Metrics
from tests.benchmarks.test_gpu_check import load

report = load("report")


def served(rps: float, cpu_ms: float) -> dict[str, Any]:
    return {"1": {"throughput_rps": rps, "server_cpu_ms_per_request": cpu_ms, "p50_ms": 1.0, "p99_ms": 2.0,
                  "codes": {"200": 10}, "transport_errors": 0}}


def raw(inputs_per_s: float) -> dict[str, Any]:
    return {"1": {"method": "scored_rows", "inputs_per_s": inputs_per_s, "batch": 32, "by_batch": {}}}


def test_overhead_is_per_round_against_its_own_raw_forward() -> None:
    results = {"samples": [1], "trees": [{"label": "a"}, {"label": "b"}], "rounds": [
        {"served": {"a": served(500, 2.0), "b": served(600, 1.5)}, "raw": {"a": raw(1000), "b": raw(900)}},
        {"served": {"a": served(400, 2.0), "b": served(500, 1.5)}, "raw": {"a": raw(800), "b": raw(1000)}},
    ], "command": "c", "model": "m", "version": "1", "clients": 32, "seconds": 5, "threads": 1, "cpu_count": 2,
        "torch": "t", "date": "d", "method": "scored_rows"}
    summarise(results)
    a, b = results["summary"]["a"]["1"], results["summary"]["b"]["1"]
    assert a["overhead"] == {"median": 1.0, "min": 1.0, "max": 1.0}  # 1000/500 and 800/400
    assert b["overhead"]["min"] == pytest.approx(0.5) and b["overhead"]["max"] == pytest.approx(1.0)
    assert b["vs_first"] == {"median": 1.225, "min": 1.2, "max": 1.25}  # 600/500, 500/400
    assert a["cpu_beyond_forward"]["min"] == pytest.approx(2.0 / 1.25 - 1)  # 2 ms against 1.25 ms per input at 800/s
    table = [line for line in markdown(results) if line.startswith("| b |")]
    assert table == ["| b | 1 | 550.0 [500.0, 600.0] | 950.0 | 75% [50%, 100%] | 1.23x [1.20, 1.25] | "
                     "1.500 [1.500, 1.500] | 42% [35%, 50%] |"]  # 1.5 ms against 1.11 and 1.0 ms


def test_budget_repeats_pair_each_ratio_with_the_same_repeats_deterministic_search() -> None:
    def row(label: str, method: str, repeat: int, rps: float | None, batching: str = "batching") -> dict[str, Any]:
        return {"label": label, "method": method, "n_samples": 1, "batching": batching, "repeat": repeat,
                "max_rps": rps}

    rows = [row("DIRECTOR", "director", 0, 90), row("deterministic", "deterministic", 0, 100),
            row("DIRECTOR", "director", 1, 45), row("deterministic", "deterministic", 1, 60),
            row("DIRECTOR", "director", 2, None), row("deterministic", "deterministic", 2, 80)]
    director, plain = report.repeated(rows)
    assert director["repeats"] == 3 and plain["repeats"] == 3
    assert director["max_rps"] == {"median": 67.5, "min": 45, "max": 90}  # the search that passed nothing is left out
    assert director["vs_deterministic"] == {"median": 0.825, "min": 0.75, "max": 0.9}  # 90/100 and 45/60, paired
    lines = report.budget_section({"rows": rows, "repeats": 3, "repeated": [director, plain], "budget_ms": 50,
                                   "command": "c", "models": {"director": "d", "deterministic": "p"}, "threads": 1,
                                   "point_seconds": 5, "search_steps": 4, "max_batch_samples": 128})
    assert "| DIRECTOR | 1 | batching | 67.5 [45, 90] | 2.00x | 0.82x [0.75, 0.90] |" in lines
    assert "| DIRECTOR | 1 | batching | 45 | 1.0 / 1.0 / 1.0 | 0.75x |" not in lines  # rows without latencies


def test_worker_totals_read_the_servers_own_batch_series() -> None:
    """The totals come from the exposition the server's real registry writes, summed over versions."""
    metrics = Metrics()
    for version, (seconds, inputs) in {"1": (0.25, 16), "2": (0.5, 8)}.items():
        metrics.inference.labels("m", version).observe(seconds)
        metrics.batch_size.labels("m", version).observe(inputs)
    assert worker_totals_of(metrics.expose().decode()) == {"batch_seconds": 0.75, "inputs": 24.0, "batches": 2.0}


def test_worker_figures_compare_the_served_rate_with_the_workers_own_batches_of_the_same_seconds() -> None:
    before = {"batch_seconds": 1.0, "inputs": 100.0, "batches": 10.0}
    after = {"batch_seconds": 5.8, "inputs": 5_100.0, "batches": 322.5}
    figures = worker_figures(before, after, wall_s=6.0)
    assert figures == {"busy": 0.8, "inputs_per_batch": 16.0, "batch_inputs_per_s": 1041.7}
    results = {"samples": [1], "trees": [{"label": "a"}], "rounds": [
        {"served": {"a": {"1": {**served(800, 1.5)["1"], "worker": figures, "generator_cpu_ms_per_request": 0.05}}},
         "raw": {"a": raw(1000)}},
        {"served": {"a": served(700, 1.5)}, "raw": {"a": raw(1000)}},  # a round of an older run: no worker figures
    ], "command": "c", "model": "m", "version": "1", "clients": 32, "seconds": 6, "threads": 1, "cpu_count": 2,
        "torch": "t", "date": "d", "method": "scored_rows"}
    summarise(results)
    row = results["summary"]["a"]["1"]
    assert row["overhead_in_run"]["median"] == pytest.approx(1041.7 / 800 - 1, abs=1e-3)
    assert row["worker_busy"] == {"median": 0.8, "min": 0.8, "max": 0.8}
    assert "| a | 1 | 80% [80%, 80%] | 16.0 | 30% [30%, 30%] | 0.050 |" in markdown(results)
