"""The manifest's ``multi_label`` section (format 1.7): how a multi-label version (``task: "multi_label"``, an
independent sigmoid per label) turns its per-label probabilities into calibrated ones and into the labels it
predicts. Standard library and pydantic only, like the rest of the contract."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from artifact.section import Section


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

    @model_validator(mode="after")
    def _in_range(self) -> MultiLabel:
        if any(not 0.0 < t < 1.0 for t in self.thresholds):
            raise ValueError("every threshold must be in (0, 1)")
        if self.temperatures is not None and any(t <= 0 for t in self.temperatures):
            raise ValueError("every temperature must be > 0")
        if self.temperatures is not None and len(self.temperatures) != len(self.thresholds):
            raise ValueError(f"{len(self.temperatures)} temperatures for {len(self.thresholds)} thresholds")
        return self
