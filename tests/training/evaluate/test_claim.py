"""The method paper's claim on an evaluation page: the verdict follows from the paired intervals it reads."""

from __future__ import annotations

from typing import Any

from training.evaluate.claim import claim_section, verdict


def diff(value: float, low: float, high: float) -> dict[str, Any]:
    return {"difference": value, "ci95": [low, high]}


def test_the_verdict_reads_both_intervals() -> None:
    assert verdict(diff(0.004, 0.001, 0.007), diff(-0.004, -0.008, -0.001)).startswith("holds on this task")
    assert verdict(diff(0.004, 0.001, 0.007), diff(-0.004, -0.008, 0.0001)) == (
        "holds in its point estimates; this split resolves accuracy, the other interval reaches 0")
    assert verdict(diff(-0.004, -0.007, -0.001), diff(-0.004, -0.008, -0.001)).startswith("does not hold")
    assert verdict(diff(0.001, -0.002, 0.004), diff(0.001, -0.002, 0.003)).startswith("is not resolved")


def test_the_section_appears_only_beside_a_kep_svgp_row() -> None:
    methods = {"director_s4": {"label": "DIRECTOR (S=4)"}, "director_s1": {"label": "DIRECTOR (S=1)"}}
    results: dict[str, Any] = {"test_and_ood": methods, "settings": {"samples": 4}, "paired": {}}
    assert claim_section(results) == []
    methods["kep_svgp"] = {"label": "KEP-SVGP (S=4)"}
    results["paired"]["director_s4 - kep_svgp"] = {"accuracy": diff(0.01, 0.005, 0.015),
                                                   "ece": diff(-0.01, -0.02, -0.005), "nll": diff(-0.1, -0.2, -0.05)}
    section = "\n".join(claim_section(results))
    assert "DIRECTOR (S=4): accuracy +1.00 points [+0.50, +1.50]" in section and "holds on this task" in section
    assert "DIRECTOR (S=1)" not in section  # no paired row for it: nothing invented
