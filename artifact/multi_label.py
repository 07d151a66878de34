"""The manifest's ``multi_label`` section (format 1.7): how a multi-label version (``task: "multi_label"``, an
independent sigmoid per label) turns its per-label probabilities into calibrated ones and into the labels it
predicts, and (1.8, ``recall``) the file that answers a request's ``coverage`` with a label set whose expected recall
is at least that coverage (docs/method.md, "Multi-label models: label sets with a recall guarantee"). Standard library
and pydantic only, like the rest of the contract."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, NonNegativeInt, PositiveInt, model_validator

from artifact.conformal import CoverageRange
from artifact.section import Section

LABEL_RECALL_FILE = "label_recall.json"
MAX_INPUTS_WITHOUT_LABELS = 100  # calibration inputs without a true label, per input with one, at the most


class LabelRecall(Section):
    """What the label-recall file holds: the calibration split's true labels, each with its served probability
    (ascending) and its input's weight ``1 / (number of true labels)``; ``models.label_recall`` turns any coverage in
    ``coverage_range`` into a probability threshold by conformal risk control of the false-negative rate."""

    file: Literal["label_recall.json"] = LABEL_RECALL_FILE  # in the version folder, named in the manifest's files
    n: PositiveInt  # calibration inputs, those without a true label included
    entries: NonNegativeInt  # their true labels: the file's list lengths
    split: str  # how the calibration split was carved, in words
    coverage_range: CoverageRange = (0.5, 0.999)


def read_label_recall_file(folder: Path, section: LabelRecall) -> dict[str, list[float]]:
    """The file of ``section`` in a version ``folder``, checked against it: ``probabilities`` ascending in [0, 1] and
    ``weights`` in (0, 1], ``entries`` of each."""
    document = json.loads((folder / section.file).read_text())
    probabilities, weights = document["probabilities"], document["weights"]
    if len(probabilities) != section.entries or len(weights) != section.entries:
        raise ValueError(f"{section.file}: probabilities and weights must hold {section.entries} values each")
    if any(not (isinstance(p, float | int) and 0.0 <= p <= 1.0) for p in probabilities) \
            or any(b < a for a, b in zip(probabilities, probabilities[1:], strict=False)):
        raise ValueError(f"{section.file}: probabilities must be ascending values in [0, 1]")
    if any(not (isinstance(w, float | int) and math.isfinite(w) and 0.0 < w <= 1.0) for w in weights):
        raise ValueError(f"{section.file}: every weight must be in (0, 1]")
    labelled = round(sum(weights))  # each input with true labels weighs 1 in all
    if not labelled <= section.n <= (1 + MAX_INPUTS_WITHOUT_LABELS) * max(labelled, 1):
        # an n far beyond the labelled inputs would shrink the measured miss rate and make every label set empty
        raise ValueError(f"{section.file}: n = {section.n} does not fit the {labelled} calibration inputs with true "
                         "labels")
    return {"probabilities": probabilities, "weights": weights}


class MultiLabel(Section):
    """Per label, in the manifest's ``labels`` order: the decision threshold (a label is predicted when its
    probability is at least its threshold) and, when ``temperature_rule`` chose them, a temperature dividing that
    label's logit after the manifest's ``temperature``."""

    thresholds: list[float] = Field(min_length=1)
    threshold_rule: str  # "fixed" (0.5 each), or "f1": each label's threshold maximising its F1 on validation
    temperatures: list[float] | None = None  # one per label; absent: the manifest's temperature alone
    temperature_rule: str | None = None  # "one" or "per_label", and what chose it
    temperature_fit: dict[str, Any] | None = None  # the validation NLLs the choice was made on
    label_ece: list[float] | None = None  # each label's validation ECE under the served calibration
    ood_note: str | None = None  # how the OOD score's statistics were fitted without classes
    recall: LabelRecall | None = None  # label sets with a recall guarantee (1.8); absent: coverage is refused

    @model_validator(mode="after")
    def _in_range(self) -> MultiLabel:
        if any(not 0.0 < t < 1.0 for t in self.thresholds):
            raise ValueError("every threshold must be in (0, 1)")
        if self.temperatures is not None and any(t <= 0 for t in self.temperatures):
            raise ValueError("every temperature must be > 0")
        if self.temperatures is not None and len(self.temperatures) != len(self.thresholds):
            raise ValueError(f"{len(self.temperatures)} temperatures for {len(self.thresholds)} thresholds")
        return self
