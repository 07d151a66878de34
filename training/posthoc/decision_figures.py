"""What a version's prediction sets and abstentions do on the test split, as a request gets them by default (the
version's default conformal score, marginal coverage, abstention by confidence alone): the figures of the results
page and the model card, so that a user's own model says what ``coverage`` and ``max_risk`` give on its held-out data
(docs/method.md, "Acting on uncertainty: prediction sets and abstentions"). Calibrated exactly as the manifest's
``conformal.json`` is, on the calibration split the export carved off validation."""

from __future__ import annotations

from typing import Any

import torch

from models.conformal import ConformalTable, ScoreRule, label_scores, set_figures
from models.selective import answered_risk, learn_then_test

COVERAGES = (0.8, 0.9, 0.95, 0.99)  # the levels the pages report
RISKS = (0.02, 0.05, 0.1)


def decisions_on_test(calibration: torch.Tensor, calibration_labels: torch.Tensor, test: torch.Tensor,
                         test_labels: torch.Tensor, rule: ScoreRule, delta: float) -> dict[str, Any]:
    """From the served probabilities of the calibration split ``[n, C]`` and the test split ``[N, C]``: coverage and
    mean set size at each of ``COVERAGES``, and at each of ``RISKS`` the Learn-then-Test threshold, the share of test
    inputs answered and the error rate among them."""
    table = ConformalTable.fit(calibration, calibration_labels, rule)
    scores = label_scores(test, rule)  # [N, C]
    sets = {f"{c:g}": set_figures(scores <= table.thresholds(c, test.shape[1])[None, :], test_labels)
            for c in COVERAGES}
    confidence, prediction = calibration.max(dim=1)  # [n] each
    right = prediction == calibration_labels  # [n]
    test_confidence, test_prediction = test.max(dim=1)  # [N] each
    wrong = test_prediction != test_labels  # [N]
    selective = {f"{risk:g}": answered_risk(learn_then_test(confidence, right, risk, delta).threshold,
                                            test_confidence, wrong) for risk in RISKS}
    return {"score": rule.name, "calibration_inputs": int(calibration_labels.shape[0]), "delta": delta,
            "sets": sets, "selective": selective}


def decisions_section(figures: dict[str, Any] | None, modality: str) -> list[str]:
    """The page's section (nothing for a version without a conformal part)."""
    if not figures:
        return []
    inputs = "sentences" if modality == "text" else "images"
    lines = [
        "## Prediction sets and abstentions on the test split",
        "",
        f"As a request gets them by default: `conformal_score` {figures['score']}, marginal, calibrated on the "
        f"{figures['calibration_inputs']:,} validation {inputs} kept apart for this (exchangeable data: under shift "
        "the coverage drops).",
        "",
        "| coverage asked | test coverage (standard error) | mean set size |",
        "| --- | --- | --- |",
    ]
    for level, row in figures["sets"].items():
        lines.append(f"| {float(level):.0%} | {row['coverage']:.2%} ({row['coverage_se']:.2%}) | "
                     f"{row['mean_size']:.2f} |")
    lines += ["", f"Abstention (`max_risk`; the threshold holds the risk with probability {1 - figures['delta']:.0%}):",
              "", "| max_risk | confidence threshold | test inputs answered | error rate among them |",
              "| --- | --- | --- | --- |"]
    for level, row in figures["selective"].items():
        threshold = "none meets it" if row["threshold"] is None else f"{row['threshold']:.4f}"
        risk = "-" if row["risk"] is None else f"{row['risk']:.2%}"
        lines.append(f"| {float(level):g} | {threshold} | {row['answered']:.2%} | {risk} |")
    return [*lines, ""]
