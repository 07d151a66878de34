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
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PositiveInt, model_validator

from artifact.section import Section

CONFORMAL_FILE = "conformal.json"
ScoreName = Literal["lac", "aps", "raps"]


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
    coverage_range: tuple[float, float] = (0.5, 0.999)
    selective_delta: float = Field(gt=0, lt=1)  # P(selective risk > max_risk) <= delta, over calibration splits
    risk_levels: list[float] = Field(min_length=1)

    @model_validator(mode="after")
    def _default_is_served(self) -> Conformal:
        if self.default_score not in self.scores:
            raise ValueError(f"default_score {self.default_score!r} is not among the scores {self.scores}")
        return self


def read_conformal_file(folder: Path, section: Conformal, num_classes: int) -> dict[str, Any]:
    """The file of ``section`` in a version ``folder``, checked against it: every score's sorted list (and one per
    class when class-conditional), ascending, and a threshold or null per risk level."""
    document = json.loads((folder / section.file).read_text())
    for name in section.scores:
        values = document["scores"][name]
        if len(values) != section.n or any(b < a for a, b in zip(values, values[1:], strict=False)):
            raise ValueError(f"{section.file}: scores[{name!r}] must hold {section.n} ascending values")
        if section.class_conditional and len(document["per_class"][name]) != num_classes:
            raise ValueError(f"{section.file}: per_class[{name!r}] must hold one list per class ({num_classes})")
    thresholds = document["selective"]["thresholds"]
    if sorted(float(k) for k in thresholds) != sorted(section.risk_levels):
        raise ValueError(f"{section.file}: selective thresholds must be given for every risk level")
    return document
