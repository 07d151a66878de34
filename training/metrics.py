"""Classification, calibration and selective-prediction metrics on predicted probabilities.

Inputs: ``probs [N, C]`` (rows sum to 1, e.g. a sample-averaged predictive distribution) and integer
``labels [N]``; the selective-prediction metrics take a per-input ``confidence [N]`` and a boolean
``correct [N]``. Every metric returns a Python float. torchmetrics (ECE, MCE) and scikit-learn (AUROC)
are used where they implement the metric; the rest is defined here once.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torchmetrics.functional.classification import multiclass_calibration_error

from models.uncertainty import ECE_BINS, expected_calibration_error
from training.ood_metrics import auroc

# Recorded next to the numbers, so a reader knows which binning produced them.
BINNING: dict[str, str] = {
    "ece": f"{ECE_BINS} equal-width bins on the top-label confidence, l1 (bin-size-weighted mean |acc - conf|)",
    "mce": f"{ECE_BINS} equal-width bins on the top-label confidence, max over non-empty bins of |acc - conf|",
    "adaptive_ece": f"{ECE_BINS} equal-mass bins on the top-label confidence (sorted, near-equal counts), l1",
}


def _top_label(probs: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-label confidence (float64) and correctness (bool) per input."""
    confidence, predicted = probs.detach().max(-1)
    return confidence.double().cpu(), (predicted == labels.to(predicted.device)).cpu()


def accuracy(probs: torch.Tensor, labels: torch.Tensor) -> float:
    return float((probs.argmax(-1) == labels).float().mean())


def nll(probs: torch.Tensor, labels: torch.Tensor) -> float:
    """Negative log-likelihood of the (sample-averaged) predictive distribution."""
    picked = probs[torch.arange(labels.shape[0]), labels].clamp_min(1e-12)
    return float(-picked.log().mean())


def brier(probs: torch.Tensor, labels: torch.Tensor) -> float:
    """Brier score: squared error to the one-hot label summed over classes, mean over inputs (range [0, 2])."""
    onehot = torch.nn.functional.one_hot(labels.long(), probs.shape[-1]).to(torch.float64)
    return float((probs.double() - onehot.to(probs.device)).square().sum(-1).mean())


def ece(probs: torch.Tensor, labels: torch.Tensor, n_bins: int = ECE_BINS) -> float:
    """Expected calibration error, equal-width bins on the top-label confidence (l1): the one estimator the server's
    live gauge uses too (``models.uncertainty.expected_calibration_error``)."""
    confidence, correct = _top_label(probs, labels)
    return expected_calibration_error(confidence, correct, n_bins)


def mce(probs: torch.Tensor, labels: torch.Tensor, n_bins: int = ECE_BINS) -> float:
    """Maximum calibration error: the largest |acc - conf| over non-empty equal-width bins."""
    return float(multiclass_calibration_error(probs, labels, num_classes=probs.shape[-1], n_bins=n_bins, norm="max"))


def adaptive_ece(probs: torch.Tensor, labels: torch.Tensor, n_bins: int = ECE_BINS) -> float:
    """ECE on equal-mass bins: inputs sorted by top-label confidence (stable sort, so tied confidences keep
    their input order and may straddle a bin edge), cut into ``n_bins`` contiguous bins whose counts differ
    by at most one (the first ``N % n_bins`` bins get the extra input); the bin-size-weighted mean of
    |accuracy - mean confidence|. Empty bins (N < n_bins) are skipped."""
    confidence, correct = _top_label(probs, labels)
    n = confidence.shape[0]
    if n == 0:
        raise ValueError("adaptive_ece needs at least one input")
    order = torch.sort(confidence, stable=True).indices
    total = 0.0
    for idx in torch.tensor_split(order, n_bins):
        if idx.numel():
            gap = correct[idx].double().mean() - confidence[idx].mean()
            total += idx.numel() * float(gap.abs())
    return total / n


def aurc(confidence: torch.Tensor, correct: torch.Tensor) -> float:
    """Area under the risk-coverage curve (lower is better).

    Inputs are ranked by confidence, highest first; the risk at coverage k/N is the error rate of the k
    most confident inputs, and AURC is the mean of that risk over k = 1..N. Ties: within a group of
    equal confidences the ranking is undefined, so each tied input counts with the group's mean error
    (the expectation of AURC over a uniformly random order within the group; it does not depend on the
    input order, and equals the plain sorted computation when there are no ties)."""
    conf = confidence.detach().double().cpu().numpy().reshape(-1)
    errors = (~correct.detach().bool().cpu()).double().numpy().reshape(-1)
    n = conf.shape[0]
    if n == 0 or errors.shape[0] != n:
        raise ValueError(f"aurc needs matching, non-empty confidence and correct, got {n} and {errors.shape[0]}")
    order = np.argsort(-conf, kind="stable")
    conf, errors = conf[order], errors[order]
    _, group, sizes = np.unique(-conf, return_inverse=True, return_counts=True)  # groups in descending order
    errors = (np.bincount(group, weights=errors) / sizes)[group]  # each input carries its tie group's error rate
    risk = np.cumsum(errors) / np.arange(1, n + 1)
    return float(risk.mean())


def misclassification_auroc(confidence: torch.Tensor, correct: torch.Tensor) -> float:
    """AUROC of detecting misclassified inputs: errors are the positive class, lower confidence ranks as more
    likely an error (``training.ood_metrics.auroc``; ties count one half). NaN when every input is correct or
    every input is wrong (the AUROC is undefined)."""
    right = correct.detach().bool().cpu().reshape(-1)  # [N]
    if right.all() or not right.any():
        return math.nan
    doubt = -confidence.detach().double().cpu().reshape(-1)  # [N] higher = more likely an error
    return auroc(doubt[right], doubt[~right])


def ece_bootstrap(probs: torch.Tensor, labels: torch.Tensor, n_boot: int = 200, seed: int = 0,
                  n_bins: int = ECE_BINS) -> tuple[float, float, float]:
    """ECE with its 95% bootstrap percentile interval: (ece, low, high)."""
    gen = torch.Generator().manual_seed(seed)
    n = labels.shape[0]
    values = []
    for _ in range(n_boot):
        idx = torch.randint(0, n, (n,), generator=gen)
        values.append(ece(probs[idx], labels[idx], n_bins))
    stats = torch.tensor(values)
    return ece(probs, labels, n_bins), float(stats.quantile(0.025)), float(stats.quantile(0.975))


def paired_bootstrap(probs_a: torch.Tensor, probs_b: torch.Tensor, labels: torch.Tensor, n_boot: int = 1000,
                     seed: int = 0) -> dict[str, dict[str, Any]]:
    """Differences a - b of accuracy, ECE and NLL on the same inputs, each with a 95% percentile interval from
    resampling the inputs (the same resample for both methods: a paired bootstrap)."""
    metrics = {"accuracy": accuracy, "ece": ece, "nll": nll}
    gen = torch.Generator().manual_seed(seed)
    n = labels.shape[0]
    draws: dict[str, list[float]] = {k: [] for k in metrics}
    for _ in range(n_boot):
        idx = torch.randint(0, n, (n,), generator=gen)
        for key, fn in metrics.items():
            draws[key].append(fn(probs_a[idx], labels[idx]) - fn(probs_b[idx], labels[idx]))
    out = {}
    for key, fn in metrics.items():
        values = torch.tensor(draws[key])
        out[key] = {"difference": fn(probs_a, labels) - fn(probs_b, labels),
                    "ci95": [float(values.quantile(0.025)), float(values.quantile(0.975))]}
    return out


def accuracy_interval(probs: torch.Tensor, labels: torch.Tensor, n_boot: int = 1000, seed: int = 0
                      ) -> list[float]:
    """95% bootstrap percentile interval of the accuracy."""
    gen = torch.Generator().manual_seed(seed)
    correct = (probs.argmax(-1) == labels).float()  # [N]
    n = correct.shape[0]
    means = torch.stack([correct[torch.randint(0, n, (n,), generator=gen)].mean() for _ in range(n_boot)])
    return [float(means.quantile(0.025)), float(means.quantile(0.975))]


def classification_report(probs: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """Every metric of this module at its default binning (see ``BINNING``). ``misclassification_auroc`` is
    NaN when all inputs are correct or all wrong."""
    confidence, correct = _top_label(probs, labels)
    return {
        "accuracy": accuracy(probs, labels), "nll": nll(probs, labels), "brier": brier(probs, labels),
        "ece": ece(probs, labels), "adaptive_ece": adaptive_ece(probs, labels), "mce": mce(probs, labels),
        "aurc": aurc(confidence, correct), "misclassification_auroc": misclassification_auroc(confidence, correct),
    }
