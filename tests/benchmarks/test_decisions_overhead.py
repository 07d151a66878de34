"""The decisions overhead page from a run's per-round medians: each asking variant against the plain request of the
same round, as a ratio of medians and paired request by request, and the target's verdict."""

from __future__ import annotations

import pytest

from benchmarks.decisions_overhead import TARGET, markdown, overheads, paired_overheads


def round_of(plain: float, coverage: float, max_risk: float, both: float) -> dict[str, dict[str, float]]:
    """A round whose paired differences are a tenth of the difference of its medians."""
    return {name: {"server_ms": ms, "round_trip_ms": 2 * ms, "paired_ms": (ms - plain) / 10}
            for name, ms in (("plain", plain), ("coverage", coverage), ("max_risk", max_risk), ("both", both))}


def test_overhead_is_per_round_against_that_rounds_plain_request() -> None:
    rounds = [round_of(10.0, 10.2, 10.1, 10.4), round_of(12.0, 12.0, 12.6, 12.3)]
    server = overheads(rounds, "server_ms")
    assert server["coverage"]["min"] == pytest.approx(0.0) and server["coverage"]["max"] == pytest.approx(0.02)
    assert server["max_risk"]["median"] == pytest.approx((0.01 + 0.05) / 2)
    assert overheads(rounds, "round_trip_ms") == server  # the same ratios at twice the times
    paired = paired_overheads(rounds)
    assert paired["max_risk"]["max"] == pytest.approx(0.005) and paired["both"]["median"] == pytest.approx(0.00325)
    results = {"date": "d", "command": "c", "model": "m", "version": "9", "threads": 1, "rounds": 2,
               "requests": 5, "load": [1.5, 2.25], "per_round": rounds, "server_overhead": server,
               "paired_server_overhead": paired, "round_trip_overhead": server,
               "decide_us": {"coverage": 4.0, "max_risk": 3.0, "both": 6.5}}
    lines = markdown(results)
    assert any(line.startswith('| {"coverage": 0.9} | 11.10 |') and "+1.0% [+0.0, +2.0] | +0.1% [+0.0, +0.2]"
               in line and line.endswith("| 4.0 |") for line in lines)
    assert any("1.50 at the start, 2.25 at the end" in line for line in lines)
    assert max(v["median"] for v in server.values()) <= TARGET
    assert "+0.3% paired (met)" in lines[-1] and lines[-1].endswith("as a ratio of medians (met).")
    slower = {name: {"median": 0.06, "min": 0.05, "max": 0.07} for name in paired}
    assert markdown({**results, "server_overhead": slower})[-1].endswith("as a ratio of medians (not met).")
