"""Split conformal prediction sets on served probabilities (pure torch, shared by the export and the server;
docs/method.md, "Acting on uncertainty: prediction sets and abstentions").

A nonconformity score says how badly a label fits an input (higher = worse), from the served probabilities
``p [N, C]``:

- ``lac`` (least ambiguous set-valued classifier): ``1 - p_y``;
- ``aps`` (adaptive prediction sets): the probability mass of every label ranked at or above ``y``, itself included.
  Not randomised: a request's set is reproducible, and its coverage is at least the target (randomised APS reaches
  it exactly, at the price of sets that change between two identical calls);
- ``raps`` (regularised APS): APS plus ``penalty * max(0, rank_y - free_ranks)`` (rank 1 = most probable), which keeps
  the long tail of tiny probabilities out of the sets.

Calibration keeps the calibration split's scores sorted (``ConformalTable``), so that every coverage ``1 - alpha`` is
answered exactly: the threshold is the ``ceil((n + 1)(1 - alpha))``-th smallest score, and no finite threshold (every
label) when that rank exceeds ``n``. An input's set is every label whose score is at most the threshold, most
probable first. Under exchangeability of the calibration and test inputs this covers the true label with probability
at least ``1 - alpha`` (marginally, over inputs; not for each input, and not under shift). The class-conditional
(Mondrian) variant keeps one sorted list per class and gives each label its own class's threshold, so the guarantee
holds within each class.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

SCORES = ("lac", "aps", "raps")


@dataclass(frozen=True)
class ScoreRule:
    """Which nonconformity score, and RAPS's regularisation."""

    name: str = "aps"
    penalty: float = 0.0  # RAPS: added per rank beyond ``free_ranks``
    free_ranks: int = 0

    def __post_init__(self) -> None:
        if self.name not in SCORES:
            raise ValueError(f"unknown conformal score {self.name!r}; expected one of {SCORES}")


def label_scores(probs: torch.Tensor, rule: ScoreRule) -> torch.Tensor:
    """Every label's score as if it were the true one: ``probs [N, C]`` -> ``[N, C]``."""
    p = probs.double()
    if rule.name == "lac":
        return 1.0 - p  # [N, C]
    order = p.argsort(dim=1, descending=True, stable=True)  # [N, C] labels, most probable first
    mass = p.gather(1, order).cumsum(dim=1)  # [N, C] mass up to and including each rank
    scores = torch.empty_like(p).scatter_(1, order, mass)  # [N, C] back to label order
    if rule.name == "raps":
        ranks = torch.empty_like(order).scatter_(1, order, torch.arange(1, p.shape[1] + 1).expand_as(order))  # [N, C]
        scores = scores + rule.penalty * (ranks - rule.free_ranks).clamp_min(0).double()
    return scores


def true_label_scores(probs: torch.Tensor, labels: torch.Tensor, rule: ScoreRule) -> torch.Tensor:
    """The score of each input's true label: ``[N]``."""
    return label_scores(probs, rule).gather(1, labels[:, None]).squeeze(1)  # [N]


def conformal_threshold(sorted_scores: torch.Tensor, coverage: float) -> float:
    """The split-conformal threshold at ``coverage`` from ascending calibration scores ``[n]``: the
    ``ceil((n + 1) * coverage)``-th smallest, or +inf (every label) when ``n`` is too small for that coverage."""
    if not 0.0 < coverage < 1.0:
        raise ValueError(f"coverage must be in (0, 1), got {coverage}")
    n = int(sorted_scores.shape[0])
    rank = math.ceil((n + 1) * coverage - 1e-9)  # the tolerance keeps (n + 1) * 0.9 = 900.0000000001 at 900
    return math.inf if rank > n else float(sorted_scores[rank - 1])


@dataclass(frozen=True)
class ConformalTable:
    """The calibration split's scores, sorted: one list (marginal) or one per class (Mondrian)."""

    rule: ScoreRule
    marginal: torch.Tensor  # [n] ascending, float64
    per_class: tuple[torch.Tensor, ...] = ()  # C lists, ascending; empty unless class-conditional

    @classmethod
    def fit(cls, probs: torch.Tensor, labels: torch.Tensor, rule: ScoreRule, class_conditional: bool = False
            ) -> ConformalTable:
        scores = true_label_scores(probs, labels, rule)  # [n]
        per_class = tuple(scores[labels == c].sort().values for c in range(probs.shape[1])) if class_conditional \
            else ()
        return cls(rule, scores.sort().values, per_class)

    def thresholds(self, coverage: float, num_classes: int) -> torch.Tensor:
        """Each label's threshold ``[C]``: the marginal one for every label, or its own class's."""
        if not self.per_class:
            return torch.full((num_classes,), conformal_threshold(self.marginal, coverage), dtype=torch.float64)
        return torch.tensor([conformal_threshold(s, coverage) for s in self.per_class], dtype=torch.float64)

    def sets(self, probs: torch.Tensor, coverage: float) -> list[list[int]]:
        """Each input's prediction set at ``coverage``: label indices, most probable first."""
        included = label_scores(probs, self.rule) <= self.thresholds(coverage, probs.shape[1])[None, :]  # [N, C]
        # a set is a few labels: ordering them in Python is cheaper than a sort of every label per request
        return [sorted((c for c, kept in enumerate(mask) if kept), key=lambda c, row=row: -row[c])
                for row, mask in zip(probs.tolist(), included.tolist(), strict=True)]


def set_figures(included: torch.Tensor, labels: torch.Tensor | None) -> dict[str, float]:
    """Of sets given as which labels each keeps ``[N, C]`` (bool): the mean set size, and with labels ``[N]`` the
    empirical coverage and its binomial standard error."""
    out = {"mean_size": float(included.sum(dim=1).double().mean())}
    if labels is not None:
        covered = included.gather(1, labels[:, None]).squeeze(1).double()  # [N]
        rate = float(covered.mean())
        out.update(coverage=rate, coverage_se=math.sqrt(rate * (1 - rate) / len(covered)))
    return out
