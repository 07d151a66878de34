"""Metrics of training/metrics.py against reference implementations and hand-made cases."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score
from torchmetrics.classification import MulticlassCalibrationError

from training.metrics import (
    BINNING,
    ECE_BINS,
    accuracy,
    adaptive_ece,
    aurc,
    brier,
    classification_report,
    ece,
    ece_bootstrap,
    mce,
    misclassification_auroc,
    nll,
)


def random_predictions(n: int, c: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    probs = (torch.randn(n, c, generator=gen) * 2.0).softmax(-1)
    labels = torch.randint(0, c, (n,), generator=gen)
    # make it better than chance so every bin and both classes of correctness are populated
    keep = torch.rand(n, generator=gen) < 0.5
    labels = torch.where(keep, probs.argmax(-1), labels)
    return probs, labels


def brute_aurc(confidence: np.ndarray, correct: np.ndarray) -> float:
    """Risk-coverage area by a loop over coverage levels (inputs assumed to have distinct confidences)."""
    order = sorted(range(len(confidence)), key=lambda i: -confidence[i])
    risks = []
    for k in range(1, len(order) + 1):
        top = order[:k]
        risks.append(sum(1.0 - correct[i] for i in top) / k)
    return float(np.mean(risks))


def brute_adaptive_ece(confidence: np.ndarray, correct: np.ndarray, n_bins: int) -> float:
    order = np.argsort(confidence, kind="stable")
    n = len(order)
    base, extra = divmod(n, n_bins)
    total, start = 0.0, 0
    for b in range(n_bins):
        size = base + (1 if b < extra else 0)
        idx = order[start:start + size]
        start += size
        if size:
            total += size * abs(correct[idx].mean() - confidence[idx].mean())
    assert start == n
    return total / n


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ece_and_mce_match_torchmetrics_class(seed: int) -> None:
    probs, labels = random_predictions(500, 7, seed)
    for norm, ours in (("l1", ece), ("max", mce)):
        reference = MulticlassCalibrationError(num_classes=7, n_bins=15, norm=norm)
        reference.update(probs, labels)
        assert ours(probs, labels) == pytest.approx(float(reference.compute()), abs=1e-6)
    assert ECE_BINS == 15 and "15 equal-width" in BINNING["ece"] and "equal-mass" in BINNING["adaptive_ece"]


def test_perfectly_calibrated_bins_give_zero_ece() -> None:
    # 10 inputs at confidence 0.8 (8 correct) and 10 at 0.6 (6 correct), two classes
    conf = torch.tensor([0.8] * 10 + [0.6] * 10)
    probs = torch.stack([conf, 1 - conf], 1)
    labels = torch.tensor([0] * 8 + [1] * 2 + [0] * 6 + [1] * 4)
    assert ece(probs, labels) == pytest.approx(0.0, abs=1e-6)
    assert mce(probs, labels) == pytest.approx(0.0, abs=1e-6)
    assert adaptive_ece(probs, labels, n_bins=2) == pytest.approx(0.0, abs=1e-6)  # float32 0.8
    # overconfident by 0.3 everywhere -> ECE = MCE = 0.3
    wrong = torch.tensor([0] * 5 + [1] * 5 + [0] * 3 + [1] * 7)
    assert ece(probs, wrong) == pytest.approx(0.3, abs=1e-6)
    assert mce(probs, wrong) == pytest.approx(0.3, abs=1e-6)


@pytest.mark.parametrize(("n", "n_bins"), [(500, 15), (37, 15), (7, 15), (100, 10)])
def test_adaptive_ece_matches_brute_force(n: int, n_bins: int) -> None:
    probs, labels = random_predictions(n, 5, n)
    confidence, predicted = probs.max(-1)
    correct = (predicted == labels).double().numpy()
    expected = brute_adaptive_ece(confidence.double().numpy(), correct, n_bins)
    assert adaptive_ece(probs, labels, n_bins) == pytest.approx(expected, abs=1e-12)


def test_brier_matches_numpy_formula() -> None:
    probs, labels = random_predictions(300, 6, 3)
    p = probs.double().numpy()
    onehot = np.eye(6)[labels.numpy()]
    assert brier(probs, labels) == pytest.approx(float(((p - onehot) ** 2).sum(1).mean()), abs=1e-12)
    # known values: a perfect one-hot prediction scores 0, a confidently wrong one 2, uniform 1 - 1/C
    assert brier(torch.eye(3), torch.arange(3)) == 0.0
    assert brier(torch.eye(3), torch.tensor([1, 2, 0])) == pytest.approx(2.0)
    assert brier(torch.full((4, 4), 0.25), torch.arange(4)) == pytest.approx(0.75)


def test_accuracy_and_nll_known_values() -> None:
    probs = torch.tensor([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4]])
    labels = torch.tensor([0, 1, 1])
    assert accuracy(probs, labels) == pytest.approx(2 / 3)
    assert nll(probs, labels) == pytest.approx(-(math.log(0.9) + math.log(0.8) + math.log(0.4)) / 3, rel=1e-6)


@pytest.mark.parametrize("seed", [0, 1])
def test_aurc_matches_brute_force_loop(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    confidence = torch.rand(200, generator=gen, dtype=torch.float64)  # distinct almost surely
    correct = torch.rand(200, generator=gen) < confidence.float()
    expected = brute_aurc(confidence.numpy(), correct.numpy().astype(float))
    assert aurc(confidence, correct) == pytest.approx(expected, abs=1e-12)


def test_aurc_known_values_and_ties() -> None:
    # errors ranked last: risk 0 for k <= 2, then 1/3, 2/4 -> mean (0 + 0 + 1/3 + 1/2) / 4
    confidence = torch.tensor([0.9, 0.8, 0.3, 0.2])
    assert aurc(confidence, torch.tensor([True, True, False, False])) == pytest.approx((1 / 3 + 1 / 2) / 4)
    assert aurc(confidence, torch.ones(4, dtype=torch.bool)) == 0.0
    assert aurc(confidence, torch.zeros(4, dtype=torch.bool)) == 1.0
    # ties: the value is the mean over every order of the tied inputs, whatever the input order
    confidence = torch.tensor([0.7, 0.5, 0.5, 0.5, 0.2])
    correct = torch.tensor([True, False, True, True, False])
    tied = [1, 2, 3]
    values = []
    for perm in itertools.permutations(tied):
        order = [0, *perm, 4]
        distinct = torch.tensor([5.0, 4.0, 3.0, 2.0, 1.0])[torch.argsort(torch.tensor(order))]
        values.append(aurc(distinct, correct))
    assert aurc(confidence, correct) == pytest.approx(float(np.mean(values)), abs=1e-12)
    assert aurc(confidence.flip(0), correct.flip(0)) == pytest.approx(aurc(confidence, correct), abs=1e-12)


def test_misclassification_auroc_matches_sklearn() -> None:
    gen = torch.Generator().manual_seed(4)
    confidence = torch.rand(300, generator=gen)
    correct = torch.rand(300, generator=gen) < confidence
    errors = (~correct).numpy().astype(int)
    expected = roc_auc_score(errors, -confidence.numpy())
    assert misclassification_auroc(confidence, correct) == pytest.approx(expected, abs=1e-12)
    # a perfect error detector: every error less confident than every correct input
    assert misclassification_auroc(torch.tensor([0.9, 0.8, 0.4, 0.3]), torch.tensor([True, True, False, False])) == 1.0
    assert math.isnan(misclassification_auroc(torch.tensor([0.9, 0.8]), torch.tensor([True, True])))


def test_classification_report_has_every_metric_as_float() -> None:
    probs, labels = random_predictions(400, 10, 5)
    report = classification_report(probs, labels)
    assert set(report) == {"accuracy", "nll", "brier", "ece", "adaptive_ece", "mce", "aurc",
                           "misclassification_auroc"}
    assert all(isinstance(v, float) and math.isfinite(v) for v in report.values())
    assert report["ece"] == ece(probs, labels) and report["mce"] >= report["ece"]
    confidence, predicted = probs.max(-1)
    assert report["aurc"] == aurc(confidence, predicted == labels)


def test_ece_bootstrap_interval_brackets_the_estimate() -> None:
    probs, labels = random_predictions(300, 4, 6)
    value, low, high = ece_bootstrap(probs, labels, n_boot=50, seed=0)
    assert value == ece(probs, labels) and low <= high and low <= value + 0.05
    assert ece_bootstrap(probs, labels, n_boot=50, seed=0) == (value, low, high)


def test_paired_bootstrap_sees_a_real_difference_and_not_a_null_one() -> None:
    from training.metrics import accuracy_interval, paired_bootstrap

    gen = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 3, (600,), generator=gen)
    right = torch.nn.functional.one_hot(labels, 3).float() * 0.7 + 0.1  # [N, 3] confident and right
    noisy = torch.rand(600, 3, generator=gen).softmax(-1)  # [N, 3] uninformative
    better = paired_bootstrap(right, noisy, labels, n_boot=200)
    assert better["accuracy"]["ci95"][0] > 0 and better["nll"]["ci95"][1] < 0
    same = paired_bootstrap(noisy, noisy, labels, n_boot=50)
    assert same["accuracy"] == {"difference": 0.0, "ci95": [0.0, 0.0]}
    low, high = accuracy_interval(noisy, labels, n_boot=200)
    assert low < float((noisy.argmax(-1) == labels).float().mean()) < high
