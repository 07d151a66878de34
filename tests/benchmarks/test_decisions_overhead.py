"""The decisions overhead page from a run's per-round medians: each asking variant against the plain request of the
same round, and the target's verdict."""

from __future__ import annotations

import pytest

from benchmarks.decisions_overhead import TARGET, markdown, overheads


def round_of(plain: float, coverage: float, max_risk: float, both: float) -> dict[str, dict[str, float]]:
    return {name: {"server_ms": ms, "round_trip_ms": 2 * ms}
            for name, ms in (("plain", plain), ("coverage", coverage), ("max_risk", max_risk), ("both", both))}


def test_overhead_is_per_round_against_that_rounds_plain_request() -> None:
    rounds = [round_of(10.0, 10.2, 10.1, 10.4), round_of(12.0, 12.0, 12.6, 12.3)]
    server = overheads(rounds, "server_ms")
    assert server["coverage"]["min"] == pytest.approx(0.0) and server["coverage"]["max"] == pytest.approx(0.02)
    assert server["max_risk"]["median"] == pytest.approx((0.01 + 0.05) / 2)
    assert overheads(rounds, "round_trip_ms") == server  # the same ratios at twice the times
    results = {"date": "d", "command": "c", "model": "m", "version": "9", "threads": 1, "rounds": 2,
               "requests": 5, "per_round": rounds, "server_overhead": server, "round_trip_overhead": server}
    lines = markdown(results)
    assert any(line.startswith('| {"coverage": 0.9} | 11.10 |') and "+1.0% [+0.0, +2.0]" in line for line in lines)
    worst = max(v["median"] for v in server.values())
    assert worst <= TARGET and lines[-1].endswith("(met).")
