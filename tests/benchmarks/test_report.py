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
