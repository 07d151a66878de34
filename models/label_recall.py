"""Label sets with a recall guarantee for multi-label models: conformal risk control of the false-negative rate
(pure torch, shared by the export and the server; docs/method.md, "Multi-label models: label sets with a recall
guarantee").

A multi-label input has a set of true labels ``Y`` (possibly empty). The set a threshold ``lam`` gives is every label
whose served probability is at least ``lam``; its loss is the share of the true labels it misses,
``FNR(lam) = |{y in Y: p_y < lam}| / |Y|`` (0 when ``Y`` is empty), at most 1 and never smaller for a larger ``lam``.
Conformal risk control (Angelopoulos et al., 2022) picks, from the calibration split's ``n`` inputs, the largest
``lam`` with ``(n * mean FNR(lam) + 1) / (n + 1) <= 1 - coverage``; then, for a new input exchangeable with them,
``E[FNR] <= 1 - coverage``: the set holds on average at least ``coverage`` of the input's true labels (marginally over
inputs, not for each one, and not under shift). When no ``lam`` passes (``n`` too small for the coverage) every
label is in the set.

``RecallTable`` keeps what every coverage needs, so that any coverage is answered exactly: the true labels'
probabilities, ascending, each with its input's weight ``1 / |Y|``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

TOLERANCE = 1e-9  # (1 - 0.8) * 5 - 1 is -2e-16 in floating point: a budget of 0 must stay 0


@dataclass(frozen=True)
class RecallTable:
    """The calibration split's true labels: their probabilities ascending and each one's weight ``1 / |Y|``."""

    probabilities: torch.Tensor  # [m] ascending, float64: one entry per (input, true label)
    weights: torch.Tensor  # [m] float64, 1 / (the number of that input's true labels)
    n: int  # calibration inputs, those without a true label included (their loss is always 0)

    def __post_init__(self) -> None:
        if self.n < 1 or self.probabilities.shape != self.weights.shape:
            raise ValueError(f"a recall table needs n >= 1 and one weight per probability, got n={self.n}, "
                             f"{tuple(self.probabilities.shape)} and {tuple(self.weights.shape)}")

    @classmethod
    def fit(cls, probs: torch.Tensor, targets: torch.Tensor) -> RecallTable:
        """From the calibration split's served probabilities ``[n, K]`` and true labels ``[n, K]`` (0/1)."""
        truth = targets.bool()  # [n, K]
        counts = truth.sum(dim=1, keepdim=True).clamp_min(1).double()  # [n, 1]
        values = probs.double()[truth]  # [m] row-major
        weights = (1.0 / counts).expand_as(truth)[truth]  # [m]
        order = values.argsort(stable=True)  # [m]
        return cls(values[order], weights[order], int(probs.shape[0]))

    def threshold(self, coverage: float) -> float:
        """The largest ``lam`` that conformal risk control allows at ``coverage`` (a label is in the set when its
        probability is at least ``lam``): 0.0 keeps every label, +inf none."""
        if not 0.0 < coverage < 1.0:
            raise ValueError(f"coverage must be in (0, 1), got {coverage}")
        budget = (1.0 - coverage) * (self.n + 1) - 1.0  # the most summed loss n * mean FNR may reach
        if budget < -TOLERANCE:
            return 0.0
        missed = self.weights.cumsum(0)  # [m] n * mean FNR when the first j + 1 entries fall below lam
        allowed = int((missed <= budget + TOLERANCE).sum())  # entries lam may leave out (missed is non-decreasing)
        if allowed == len(missed):
            return float("inf")
        return float(self.probabilities[allowed])  # the first entry kept; ties with it are kept too

    def sets(self, probs: torch.Tensor, coverage: float) -> list[list[int]]:
        """Each input's label set at ``coverage`` from its probabilities ``[N, K]`` (``sets_at`` its threshold)."""
        return sets_at(probs, self.threshold(coverage))


def sets_at(probs: torch.Tensor, threshold: float) -> list[list[int]]:
    """Each input's labels whose probability (``[N, K]``) is at least ``threshold``: label indices, most probable
    first (ties in label order)."""
    return [sorted((k for k, p in enumerate(row) if p >= threshold), key=lambda k, row=row: -row[k])
            for row in probs.tolist()]


def recall_figures(sets: list[list[int]], targets: torch.Tensor) -> dict[str, float]:
    """Of label sets (indices) against true labels ``[N, K]`` (0/1): the mean recall (1 - FNR; 1 for an input without
    a true label), its standard error, and the mean set size."""
    truth = targets.bool()  # [N, K]
    included = torch.zeros_like(truth)
    for row, labels in enumerate(sets):
        included[row, labels] = True
    counts = truth.sum(dim=1).double()  # [N]
    hits = (included & truth).sum(dim=1).double()  # [N]
    recall = torch.where(counts > 0, hits / counts.clamp_min(1), torch.ones_like(counts))  # [N]
    spread = float(recall.std()) / len(recall) ** 0.5 if len(recall) > 1 else float("nan")
    size = float(included.sum(dim=1).double().mean())
    return {"recall": float(recall.mean()), "recall_se": spread, "mean_size": size}
