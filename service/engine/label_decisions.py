"""A multi-label version's label sets per request (docs/api.md, "Multi-label models"; docs/method.md, "Multi-label
models: label sets with a recall guarantee"): its label-recall file, loaded once with its artifact
(``LabelRecallDecisions``), answers a request's ``coverage`` with each input's labels whose probability reaches the
threshold conformal risk control gives at that coverage (``models.label_recall``), most probable first. It answers
the same asks and reports the same rules as a single-label version's ``service.engine.decisions.VersionDecisions``,
except abstentions: ``max_risk`` and the single-label sets' options are refused with the reason."""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from artifact.contract import Manifest
from artifact.multi_label import LabelRecall, read_label_recall_file
from models.label_recall import RecallTable, sets_at
from service.engine.decisions import PLANS, DecisionRequest, Decisions, every_label
from service.engine.shift import Shift
from service.engine.tasks import NO_ABSTENTIONS

RULE = "label_recall"  # the sets' rule as responses name it (``conformal_score``)
SINGLE_LABEL_OPTIONS = ("conformal_score and class_conditional shape single-label prediction sets; a multi-label "
                        "version's sets have one rule (label_recall)")


class LabelRecallDecisions:
    """The calibration split's recall table; the threshold of each coverage asked is computed once."""

    outputs = ("prediction_set", "set_size", "exchangeable")  # the OIP outputs it can produce

    def __init__(self, section: LabelRecall, document: dict[str, list[float]]) -> None:
        self.section = section
        self.table = RecallTable(torch.tensor(document["probabilities"], dtype=torch.float64),
                                 torch.tensor(document["weights"], dtype=torch.float64), section.n)
        self.threshold = functools.lru_cache(maxsize=PLANS)(self.table.threshold)  # per instance, as plans are

    @classmethod
    def load(cls, folder: Path, manifest: Manifest) -> LabelRecallDecisions | None:
        """The version's label sets, or None when its manifest has none (no calibration split, or before 1.8)."""
        section = manifest.multi_label.recall if manifest.multi_label is not None else None
        if section is None:
            return None
        return cls(section, read_label_recall_file(folder, section))

    def problem(self, ask: DecisionRequest) -> str | None:
        """Why this version cannot answer ``ask`` (a request error), or None."""
        if ask.max_risk is not None:
            return NO_ABSTENTIONS
        if ask.score is not None or ask.class_conditional:
            return SINGLE_LABEL_OPTIONS
        low, high = self.section.coverage_range
        if ask.coverage is not None and not low <= ask.coverage <= high:
            return f"coverage must be in [{low}, {high}] for this version, got {ask.coverage}"
        return None

    def decide(self, probs: torch.Tensor, shift: Shift, ask: DecisionRequest) -> Decisions:
        """Each input's label set for the request's served probabilities ``[n, C]``: every label when the request's
        inputs as a whole look shifted (unless ``widen_if_shifted`` is off), as a single-label version's sets."""
        assert ask.coverage is not None, "problem() refuses every other ask"
        widen = shift.population is not None and ask.widen_if_shifted
        sets = every_label(probs) if widen else sets_at(probs, self.threshold(ask.coverage))
        return Decisions(sets, None, ask.coverage, RULE, False, None, None, None, None, None, ask.abstain_if_ood,
                         shift.exchangeable, shift.population, ask.widen_if_shifted)
