"""A multi-label version's temperatures and thresholds (``training.export.label_calibration``)."""

from __future__ import annotations

import pytest
import torch

from training.export.label_calibration import calibrate_labels, choose_temperature, fit_label_temperatures


def overconfident(n: int = 400, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits [S=2, n, 2]: label 0 three times too confident, label 1 calibrated."""
    gen = torch.Generator().manual_seed(seed)
    true = torch.randn(n, 2, generator=gen) * 2  # [n, 2]
    labels = (torch.rand(n, 2, generator=gen) < torch.sigmoid(true)).float()
    logits = torch.stack([true * torch.tensor([3.0, 1.0])] * 2)  # [2, n, 2]
    return logits, labels


def test_per_label_temperatures_find_each_labels_scale() -> None:
    logits, labels = overconfident()
    per_label = fit_label_temperatures(logits, labels, per_label=True)
    assert per_label[0] == pytest.approx(3.0, rel=0.25) and per_label[1] == pytest.approx(1.0, rel=0.25)
    one = fit_label_temperatures(logits, labels, per_label=False)
    assert one[0] == one[1]


def test_auto_prefers_per_label_temperatures_only_when_they_win_held_out() -> None:
    logits, labels = overconfident()
    choice = choose_temperature(logits, labels, "auto", seed=0)
    assert choice.rule == "per_label" and choice.temperature == 1.0 and choice.per_label is not None
    assert choice.fit["held_out_nll"]["per_label"] < choice.fit["held_out_nll"]["one"]
    forced = choose_temperature(logits, labels, "one", seed=0)
    assert forced.per_label is None and forced.rule == "one"


def test_thresholds_follow_the_calibrated_probabilities() -> None:
    logits, labels = overconfident()
    calibration = calibrate_labels(logits, labels, "per_label", "f1", seed=0)
    assert len(calibration.thresholds) == 2 and all(0 < t < 1 for t in calibration.thresholds)
    assert calibrate_labels(logits, labels, "one", "fixed", seed=0).thresholds == [0.5, 0.5]
    assert calibration.probabilities(logits).shape == (400, 2)
