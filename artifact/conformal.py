"""The manifest's ``conformal`` section (format 1.6) and its file: what a version needs to answer a request's
``coverage`` with a prediction set and its ``max_risk`` with an abstention (docs/method.md, "Acting on uncertainty:
prediction sets and abstentions").

The file (``CONFORMAL_FILE``, JSON, named in ``files`` with its sha256 like every other) holds the calibration
split's nonconformity scores of the true labels, sorted, for each score rule (and per class, for the class-conditional
sets), so that every coverage in ``coverage_range`` is exact, and the Learn-then-Test confidence threshold of each
risk level in ``risk_levels`` (null: no threshold meets it). Standard library and pydantic only, like the rest of the
contract.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, PositiveInt, model_validator

from artifact.section import Section

CONFORMAL_FILE = "conformal.json"
ScoreName = Literal["lac", "aps", "raps"]
BOUNDED_SCORES = ("lac", "aps")  # in [0, 1]; RAPS adds a penalty per rank, so its scores are >= 0 only
ROUNDING = 1e-6  # float32 sums of probabilities land this far outside [0, 1]


def ordered_coverage(bounds: tuple[float, float]) -> tuple[float, float]:
    """A ``coverage_range`` a request can be answered in: finite, ``0 < low <= high < 1``."""
    low, high = bounds
    if not (math.isfinite(low) and math.isfinite(high) and 0.0 < low <= high < 1.0):
        raise ValueError(f"coverage_range must satisfy 0 < low <= high < 1, got [{low}, {high}]")
    return bounds


def probability_levels(levels: list[float]) -> list[float]:
    if any(not (math.isfinite(level) and 0.0 < level < 1.0) for level in levels):
        raise ValueError(f"every risk level must be in (0, 1), got {levels}")
    return levels


CoverageRange = Annotated[tuple[float, float], AfterValidator(ordered_coverage)]


def is_number(value: Any) -> bool:
    """A finite JSON number (a bool is not one)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


class Conformal(Section):
    """Which scores the file holds, on how many calibration inputs, and the guarantees' parameters."""

    file: Literal["conformal.json"] = CONFORMAL_FILE  # in the version folder, named in the manifest's files
    n: PositiveInt  # calibration inputs
    split: str  # how the calibration split was carved, in words
    scores: list[ScoreName] = Field(min_length=1)
    default_score: ScoreName
    raps_penalty: float = Field(0.0, ge=0)
    raps_free_ranks: int = Field(0, ge=0)
    class_conditional: bool  # the file also holds one sorted list per class
    coverage_range: CoverageRange = (0.5, 0.999)
    selective_delta: float = Field(gt=0, lt=1)  # P(selective risk > max_risk) <= delta, over calibration splits
    risk_levels: Annotated[list[float], AfterValidator(probability_levels)] = Field(min_length=1)

    @model_validator(mode="after")
    def _default_is_served(self) -> Conformal:
        if self.default_score not in self.scores:
            raise ValueError(f"default_score {self.default_score!r} is not among the scores {self.scores}")
        return self


def sorted_scores(values: Any, name: str, where: str, count: int | None = None) -> int:
    """Check one sorted list of nonconformity scores: finite numbers, ascending, >= 0 (and <= 1 for the bounded
    scores), ``count`` of them when given; returns its length. A NaN or a negative score would give empty sets at every
    coverage without a word, so the version is refused instead."""
    upper = 1.0 if name in BOUNDED_SCORES else math.inf
    if not isinstance(values, list) or (count is not None and len(values) != count):
        raise ValueError(f"{where} must hold {count if count is not None else 'a list of'} values")
    if any(not (is_number(v) and -ROUNDING <= v <= upper + ROUNDING) for v in values):
        raise ValueError(f"{where} must hold finite scores in [0, {upper:g}]")
    if any(b < a for a, b in zip(values, values[1:], strict=False)):
        raise ValueError(f"{where} must be ascending")
    return len(values)


def read_conformal_file(folder: Path, section: Conformal, num_classes: int) -> dict[str, Any]:
    """The file of ``section`` in a version ``folder``, checked against it: every score's sorted list (and one per
    class when class-conditional, together the calibration split), finite and ascending, and per risk level a
    confidence threshold in [0, 1] or null (no threshold meets it). Anything else refuses the version with the reason
    (``ValueError``) rather than answering requests wrongly."""
    document = json.loads((folder / section.file).read_text())
    try:
        for name in section.scores:
            sorted_scores(document["scores"][name], name, f"{section.file}: scores[{name!r}]", section.n)
            if section.class_conditional:
                lists = document["per_class"][name]
                if not isinstance(lists, list) or len(lists) != num_classes:
                    raise ValueError(f"{section.file}: per_class[{name!r}] must hold one list per class "
                                     f"({num_classes})")
                total = sum(sorted_scores(values, name, f"{section.file}: per_class[{name!r}][{c}]")
                            for c, values in enumerate(lists))
                if total != section.n:
                    raise ValueError(f"{section.file}: per_class[{name!r}] holds {total} scores, not {section.n}")
        thresholds = document["selective"]["thresholds"]
    except (KeyError, TypeError) as exc:
        raise ValueError(f"{section.file}: missing or malformed {exc}") from None
    if not isinstance(thresholds, dict) or sorted(float(k) for k in thresholds) != sorted(section.risk_levels):
        raise ValueError(f"{section.file}: selective thresholds must be given for every risk level")
    if any(t is not None and not (is_number(t) and 0.0 <= t <= 1.0) for t in thresholds.values()):
        raise ValueError(f"{section.file}: every selective threshold must be a confidence in [0, 1] or null")
    return document
