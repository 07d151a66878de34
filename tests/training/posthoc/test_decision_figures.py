"""The test split's sets and abstentions on the results page: calibrated as the version's conformal.json is, they
cover about what is asked on exchangeable data and keep the error rate of the answered under max_risk."""

from __future__ import annotations

import torch

from models.conformal import ConformalTable, ScoreRule
from training.posthoc.decision_figures import COVERAGES, RISKS, decisions_on_test, decisions_section


def _exchangeable(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Probabilities [n, 4] of a calibrated model (labels drawn from them), so any split of them is exchangeable."""
    gen = torch.Generator().manual_seed(seed)
    probs = (torch.randn(n, 4, generator=gen) * 2.5).softmax(-1)  # [n, 4]
    labels = torch.multinomial(probs, 1, generator=gen).squeeze(1)  # [n]
    return probs, labels


def test_coverage_and_risk_are_what_a_request_gets() -> None:
    calibration, calibration_labels = _exchangeable(4000, seed=0)
    test, test_labels = _exchangeable(4000, seed=1)
    figures = decisions_on_test(calibration, calibration_labels, test, test_labels, ScoreRule("lac"), delta=0.1)
    assert list(figures["sets"]) == [f"{c:g}" for c in COVERAGES] and list(figures["selective"]) == [
        f"{r:g}" for r in RISKS]
    for level, row in figures["sets"].items():
        assert abs(row["coverage"] - float(level)) < 0.02  # 4,000 each: well within two points
    sizes = [row["mean_size"] for row in figures["sets"].values()]
    assert sizes == sorted(sizes)  # more coverage, larger sets
    table = ConformalTable.fit(calibration, calibration_labels, ScoreRule("lac"))
    served = table.sets(test, 0.9)  # what the server answers at coverage 0.9
    assert figures["sets"]["0.9"]["mean_size"] == sum(map(len, served)) / len(served)
    for level, row in figures["selective"].items():  # Learn-then-Test holds the risk (test noise: a point)
        assert row["threshold"] is not None and row["risk"] is not None and row["risk"] <= float(level) + 0.01
    assert figures["selective"]["0.1"]["answered"] > figures["selective"]["0.02"]["answered"]


def test_the_section_reads_the_figures_and_says_when_no_threshold_meets_a_risk() -> None:
    calibration, calibration_labels = _exchangeable(300, seed=2)
    test, test_labels = _exchangeable(500, seed=3)
    figures = decisions_on_test(calibration, calibration_labels, test, test_labels, ScoreRule("aps"), delta=0.1)
    figures["selective"]["0.02"] = {"threshold": None, "answered": 0.0, "risk": None}
    page = "\n".join(decisions_section(figures, "text"))
    assert "`conformal_score` aps" in page and "300 validation sentences" in page
    assert f"| 90% | {figures['sets']['0.9']['coverage']:.2%} " in page
    assert "| 0.02 | none meets it | 0.00% | - |" in page
    assert decisions_section(None, "image") == []  # no conformal part: no section
