"""Metrics of a multi-label classifier: probabilities ``probs [N, C]`` (a sigmoid per label, sample-averaged) against
0/1 indicators ``labels [N, C]``. Each label is a binary classifier; the figures are per label and their mean.

- ECE per label: torchmetrics' ``binary_calibration_error`` (equal-width bins on the label's probability, l1), the
  reliability of P(label present); ``ece`` is the mean over labels.
- accuracy: the share of correct yes/no decisions at the thresholds (Hamming accuracy); ``exact_match`` the share of
  inputs whose every label is right; macro F1 the mean of the per-label F1.
- thresholds: 0.5, or per label the one maximising its F1 on validation (a grid; a label without positives or
  without a better threshold keeps 0.5).
"""

from __future__ import annotations

import torch
from torchmetrics.functional.classification import binary_calibration_error

from models.tasks import MultiLabel
from models.uncertainty import ECE_BINS

THRESHOLD_GRID = torch.linspace(0.05, 0.95, 19)  # candidate thresholds for the F1 fit
THRESHOLD_RULES = ("f1", "fixed")


def label_ece(probs: torch.Tensor, labels: torch.Tensor, n_bins: int = ECE_BINS) -> list[float]:
    """Each label's ECE [C] (torchmetrics ``binary_calibration_error``, l1)."""
    probs, labels = probs.detach().float().cpu(), labels.detach().long().cpu()
    return [float(binary_calibration_error(probs[:, c].contiguous(), labels[:, c].contiguous(), n_bins=n_bins,
                                           norm="l1"))
            for c in range(probs.shape[1])]


def mean_label_ece(probs: torch.Tensor, labels: torch.Tensor) -> float:
    """The mean of the labels' ECEs (``label_ece``)."""
    eces = label_ece(probs, labels)
    return sum(eces) / len(eces)


def label_f1(probs: torch.Tensor, labels: torch.Tensor, thresholds: torch.Tensor) -> torch.Tensor:
    """Each label's F1 [C] at ``thresholds`` [C] (1 for a label never present and never predicted)."""
    predicted = probs >= thresholds[None, :]  # [N, C]
    truth = labels.bool()  # [N, C]
    tp = (predicted & truth).sum(0).double()  # [C]
    fp = (predicted & ~truth).sum(0).double()  # [C]
    fn = (~predicted & truth).sum(0).double()  # [C]
    denominator = 2 * tp + fp + fn  # [C]
    return torch.where(denominator > 0, 2 * tp / denominator.clamp_min(1), torch.ones_like(tp))


def fit_thresholds(probs: torch.Tensor, labels: torch.Tensor, rule: str = "f1") -> list[float]:
    """Per label: 0.5 (``rule`` "fixed"), or the grid threshold with the best validation F1 (ties: the one nearest
    0.5; a label with no positive on validation keeps 0.5)."""
    if rule not in THRESHOLD_RULES:
        raise ValueError(f"unknown threshold rule {rule!r}; choose from {THRESHOLD_RULES}")
    count = probs.shape[1]
    if rule == "fixed":
        return [0.5] * count
    grid = THRESHOLD_GRID.double()  # [G]
    scores = torch.stack([label_f1(probs.double(), labels, torch.full((count,), float(t), dtype=torch.float64))
                          for t in grid])  # [G, C]
    chosen = []
    for c in range(count):
        if not bool(labels[:, c].bool().any()):
            chosen.append(0.5)
            continue
        best = scores[:, c].max()
        near = [(abs(float(t) - 0.5), float(t)) for t, s in zip(grid, scores[:, c], strict=True) if s >= best - 1e-12]
        chosen.append(round(min(near)[1], 4))
    return chosen


def multi_label_report(probs: torch.Tensor, labels: torch.Tensor, thresholds: list[float] | None = None
                       ) -> dict[str, float]:
    """Accuracy (Hamming), exact match, NLL (binary cross-entropy summed over labels, mean over inputs), the mean
    per-label ECE, macro F1 and the Brier score (summed over labels), at ``thresholds`` (0.5 each when None)."""
    probs, labels = probs.detach().double().cpu(), labels.detach().double().cpu()
    cut = torch.tensor(thresholds if thresholds is not None else [0.5] * probs.shape[1], dtype=torch.float64)
    predicted = probs >= cut[None, :]  # [N, C]
    correct = predicted == labels.bool()  # [N, C]
    return {"accuracy": float(correct.double().mean()), "exact_match": float(correct.all(-1).double().mean()),
            "nll": float(MultiLabel().per_input_nll(probs, labels).mean()), "ece": mean_label_ece(probs, labels),
            "macro_f1": float(label_f1(probs, labels, cut).mean()),
            "brier": float((probs - labels).square().sum(-1).mean())}
