"""The serving report's target rows: an open-loop overload run whose load generator fell behind its schedule is
reported as not measured, not as a server that refused slowly."""

from __future__ import annotations

from typing import Any

from tests.benchmarks.test_gpu_check import load

report = load("report")


def overload(lag_ms: float, refused_p99_ms: float) -> dict[str, Any]:
    run = {"offered_rps": 1000.0, "factor": 10.0, "refused_p99_ms": refused_p99_ms, "codes": {"200": 100, "503": 900},
           "transport_errors": 0, "generator_lag_p99_ms": lag_ms}
    return {"n_samples": 16, "max_batch_samples": 128, "overload": run}


def target_row(results: dict[str, Any]) -> str:
    (row,) = [line for line in report.targets_section(results) if "capacity the excess" in line]
    return row


def test_a_generator_on_schedule_judges_the_server() -> None:
    assert target_row(overload(1.5, 4.0)).endswith("| yes |")
    assert target_row(overload(1.5, 80.0)).endswith("| no |")


def test_a_lagging_generator_is_not_a_verdict_on_the_server() -> None:
    row = target_row(overload(15344.0, 15912.0))
    assert "not measured: the load generator fell behind its schedule (lag p99 15344.0 ms)" in row


def peak_results(budget_command: str) -> dict[str, Any]:
    """A load run's raw artifact figures at S = 1 and a budget run's peaks, the budget measured by ``budget_command``
    (the load run's own command is "load")."""
    raw = [{"n_samples": 1, "batch": 1, "inputs_per_s": 300.0}, {"n_samples": 1, "batch": 32, "inputs_per_s": 900.0}]
    peaks = [{"batching": "batching", "throughput_rps": 600.0}, {"batching": "batch-1", "throughput_rps": 250.0}]
    return {"n_samples": 16, "max_batch_samples": 128, "command": "load", "raw_artifact": raw,
            "budget": {"command": budget_command, "peak": peaks}}


def test_peaks_meet_the_raw_figures_only_of_their_own_run() -> None:
    """The S = 1 overhead compares the budget run's peak with the raw artifact's rate only when one command measured
    both; the batching gain reads the peaks alone, so it is reported either way."""
    same = report.targets_section(peak_results("load"))
    assert any("overhead" in line and "S = 1," in line and "50%" in line for line in same)  # 900 / 600 - 1
    other = report.targets_section(peak_results("budget"))
    assert not any("overhead" in line and "S = 1," in line for line in other)
    assert any("batching >= 4x batch-1 at 32 clients, S = 1 | 2.40x" in line for line in other)
