"""Classification and calibration metrics on predicted probabilities (torchmetrics where it has them)."""

from __future__ import annotations

import torch
from torchmetrics.functional.classification import multiclass_calibration_error

ECE_BINS = 15


def accuracy(probs: torch.Tensor, labels: torch.Tensor) -> float:
    return float((probs.argmax(-1) == labels).float().mean())


def nll(probs: torch.Tensor, labels: torch.Tensor) -> float:
    """Negative log-likelihood of the (sample-averaged) predictive distribution."""
    picked = probs[torch.arange(labels.shape[0]), labels].clamp_min(1e-12)
    return float(-picked.log().mean())


def ece(probs: torch.Tensor, labels: torch.Tensor, n_bins: int = ECE_BINS) -> float:
    """Expected calibration error, equal-width bins on the top-label confidence (l1)."""
    return float(multiclass_calibration_error(probs, labels, num_classes=probs.shape[-1], n_bins=n_bins, norm="l1"))


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


def classification_report(probs: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    return {"accuracy": accuracy(probs, labels), "ece": ece(probs, labels), "nll": nll(probs, labels)}
