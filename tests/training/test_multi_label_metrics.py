"""Per-label ECE, F1 thresholds and the multi-label report (``training.multi_label_metrics``)."""

from __future__ import annotations

import pytest
import torch
from torchmetrics.functional.classification import binary_calibration_error

from training.multi_label_metrics import fit_thresholds, label_ece, label_f1, multi_label_report


def test_label_ece_is_torchmetrics_per_label() -> None:
    torch.manual_seed(0)
    probs = torch.rand(200, 3)
    labels = (torch.rand(200, 3) < probs).long()
    eces = label_ece(probs, labels)
    for c in range(3):
        assert eces[c] == pytest.approx(float(binary_calibration_error(probs[:, c], labels[:, c], n_bins=15)))
    perfect = torch.tensor([[1.0, 0.0]] * 10)
    assert label_ece(perfect, perfect.long()) == [0.0, 0.0]


def test_f1_thresholds_follow_each_label() -> None:
    # label 0: positives have p = 0.3, negatives 0.1 -> a threshold between them; label 1: no positive -> 0.5
    probs = torch.tensor([[0.3, 0.2], [0.3, 0.7], [0.1, 0.1], [0.1, 0.6]])
    labels = torch.tensor([[1, 0], [1, 0], [0, 0], [0, 0]])
    thresholds = fit_thresholds(probs, labels)
    assert 0.1 < thresholds[0] <= 0.3 and thresholds[1] == 0.5
    assert fit_thresholds(probs, labels, "fixed") == [0.5, 0.5]
    f1 = label_f1(probs, labels, torch.tensor(thresholds))
    assert f1[0] == 1.0
    with pytest.raises(ValueError, match="threshold rule"):
        fit_thresholds(probs, labels, "youden")


def test_report_counts_decisions_and_exact_matches() -> None:
    probs = torch.tensor([[0.9, 0.2], [0.6, 0.7]])
    labels = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    report = multi_label_report(probs, labels)
    assert report["accuracy"] == pytest.approx(0.75) and report["exact_match"] == pytest.approx(0.5)
    assert report["macro_f1"] == pytest.approx((2 / 3 + 1.0) / 2)
    assert report["nll"] > 0 and 0 <= report["ece"] <= 1
