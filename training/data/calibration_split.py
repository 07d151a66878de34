"""The calibration split of prediction sets and abstentions (docs/method.md, "Acting on uncertainty: prediction sets
and abstentions"): a seeded random share of the validation split, carved off before anything is fitted on validation,
so that the conformal scores and the abstention thresholds are computed on inputs nothing else saw (their guarantees
need that). A random share, not the last rows: a user's own validation file may be sorted by label."""

from __future__ import annotations

import dataclasses
import math
from typing import TypeVar

import torch

from training.data.images import Dataset, Split
from training.data.tokens import TokenDataset, TokenSplit

Data = TypeVar("Data", Dataset, TokenDataset)
MIN_LEFT = 2  # validation inputs left for everything else
DECISIONS = "the prediction sets and abstentions"  # what a single-label version calibrates on the split
LABEL_SETS = "the label sets with a recall guarantee"  # a multi-label version's


def carve_calibration(data: Data, share: float, seed: int) -> tuple[Data, Split | TokenSplit | None]:
    """``data`` with ``share`` of its validation split moved out (the rest keeps its order), and that share: the
    calibration split (None when ``share`` is 0)."""
    if not 0.0 <= share < 1.0:
        raise ValueError(f"export.calibration_share must be in [0, 1), got {share}")
    total = len(data.val)
    count = round(total * share)
    if count == 0:
        return data, None
    if total - count < MIN_LEFT:
        raise ValueError(f"export.calibration_share {share} leaves {total - count} of {total} validation inputs for "
                         "everything else; lower it or give more validation data")
    order = torch.randperm(total, generator=torch.Generator().manual_seed(seed + 31))  # [total]
    calibration, rest = order[:count].sort().values, order[count:].sort().values
    return dataclasses.replace(data, val=data.val.subset(rest)), data.val.subset(calibration)


def calibration_line(validation: int, share: float, multi_label: bool = False) -> str:
    """The plan's line: how many validation inputs the export will carve off for the sets and abstentions (a
    multi-label run's: for its label sets)."""
    count = round(validation * share)
    if count == 0:
        return "calibration split: none (export.calibration_share 0): the version will answer no coverage or max_risk"
    line = (f"calibration split: {count:,} of the {validation:,} validation inputs (export.calibration_share "
            f"{share:g}), for {LABEL_SETS if multi_label else DECISIONS} only")
    return line if multi_label else f"{line}; {coverage_spread_note(count)}"  # the note is split conformal's spread


def coverage_spread(count: int, coverage: float = 0.9) -> float:
    """The standard deviation, between draws of ``count`` calibration inputs, of the coverage split conformal gives
    at ``coverage``: conditional on its draw it is Beta(k, n + 1 - k) with k = ceil((n + 1) * coverage)."""
    k = min(math.ceil((count + 1) * coverage), count)
    return math.sqrt(k * (count + 1 - k) / ((count + 1) ** 2 * (count + 2)))


def coverage_spread_note(count: int) -> str:
    """The plan's warning of how much one draw's coverage moves, with the size that brings it under a point."""
    spread = coverage_spread(count)
    note = f"a draw of {count:,} gives 90% coverage within about +-{100 * spread:.1f} points (one standard deviation)"
    if spread > 0.01:
        note += "; 900 or more bring it under 1 point (raise export.calibration_share if validation allows)"
    return note


def calibration_description(calibration: Split | TokenSplit, share: float, used_for: str = DECISIONS) -> str:
    """How the split was carved, in words (the manifest's ``conformal.split`` or ``multi_label.recall.split``)."""
    return (f"{len(calibration):,} validation inputs ({share:.0%} of validation, drawn under the run's seed), used for "
            f"nothing but {used_for}")
