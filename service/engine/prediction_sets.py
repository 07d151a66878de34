"""A request's prediction sets from its served probabilities and the per-label thresholds of its coverage (which
``service.engine.decisions`` computes once per version and ask): the sets ``models.conformal.ConformalTable.sets``
gives, label for label and in the same order, for less.

A request holds a few inputs of a few labels, and one torch op costs more to dispatch than scoring ten labels in
Python: up to ``PYTHON_ELEMENTS`` probabilities per request the scores are computed on Python floats, above on
tensors. Both paths repeat ``models.conformal.label_scores`` operation for operation in float64 (``1 - p``; the mass
summed rank by rank, as torch's CPU cumsum does; RAPS's penalty times a whole number of ranks, then added), so each
score, and so each set, is the same bit for bit (tests/service/engine/test_prediction_sets.py). A row holding a value
that is not finite goes the tensor way, where NaN sorts as torch sorts it."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from models.conformal import ScoreRule, label_scores

PYTHON_ELEMENTS = 128  # inputs x labels scored on Python floats (ten inputs of ten labels, one of a hundred)

Rows = list[list[float]]


def python_rows(probs: torch.Tensor) -> Rows | None:
    """The probabilities ``[n, C]`` as Python floats (exact: float32 and float64 values are doubles), or None when
    the request is large or holds a value that is not finite: then the tensor path answers."""
    if probs.shape[0] * probs.shape[1] > PYTHON_ELEMENTS:
        return None
    rows: Rows = probs.tolist()
    return rows if math.isfinite(sum(map(sum, rows))) else None  # a NaN or an infinity anywhere reaches the sum


def row_scores(row: list[float], rule: ScoreRule) -> list[float]:
    """One input's label scores, as ``models.conformal.label_scores`` computes them."""
    if rule.name == "lac":
        return [1.0 - p for p in row]
    order = sorted(range(len(row)), key=row.__getitem__, reverse=True)  # stable: ties keep label order, as torch's
    scores = [0.0] * len(row)
    mass = 0.0
    raps = rule.name == "raps"
    for rank, label in enumerate(order, start=1):
        mass += row[label]
        scores[label] = mass + rule.penalty * float(max(0, rank - rule.free_ranks)) if raps else mass
    return scores


def ordered(kept: list[int], row: list[float]) -> list[int]:
    """The kept labels, most probable first (ties in label order)."""
    return sorted(kept, key=lambda label: -row[label])


def row_sets(rows: Rows, rule: ScoreRule, thresholds: Sequence[float]) -> list[list[int]]:
    """Each input's set from its probabilities as Python floats."""
    if rule.name == "lac":
        return [ordered([c for c, p in enumerate(row) if 1.0 - p <= thresholds[c]], row) for row in rows]
    return [ordered([c for c, s in enumerate(row_scores(row, rule)) if s <= thresholds[c]], row) for row in rows]


def tensor_sets(probs: torch.Tensor, rule: ScoreRule, thresholds: torch.Tensor) -> list[list[int]]:
    """Each input's set, scored on tensors; only the kept labels are ordered in Python."""
    included = label_scores(probs, rule) <= thresholds[None, :]  # [n, C]
    rows = probs.tolist()
    kept: list[list[int]] = [[] for _ in rows]
    for index, label in included.nonzero().tolist():  # row-major: labels ascending within an input
        kept[index].append(label)
    return [ordered(labels, row) for labels, row in zip(kept, rows, strict=True)]
