"""Prediction sets and abstentions per request (docs/method.md, "Acting on uncertainty: prediction sets and
abstentions"; docs/api.md): a version's conformal file, loaded once with its artifact (``VersionDecisions``), answers
what a request asks (``DecisionRequest``) for the probabilities its batch served.

- ``coverage`` -> each input's prediction set: every label whose nonconformity score is at most the split-conformal
  threshold at that coverage, most probable first (``models.conformal``);
- ``max_risk`` -> each input's abstention: answered when its confidence reaches the Learn-then-Test threshold of the
  largest risk level in the manifest at or below ``max_risk`` (a smaller level's guarantee is stricter, so it holds
  for ``max_risk`` too; ``models.selective``). An input that does not look exchangeable with the calibration data (its
  OOD flag, or a shifted batch or live window: ``service.engine.shift``) abstains too unless the request says
  otherwise (``abstain_if_ood``).

When the request's inputs as a whole look shifted, no coverage is promised for them: unless the request says
otherwise (``widen_if_shifted``), every set holds every label, most probable first, and the answer says why. A
single flagged input keeps its set (an in-distribution input is flagged one time in twenty by construction), and
says it is not exchangeable.

What depends only on the ask (the thresholds of a coverage, the risk level) is computed once per version and ask
(``Plan``); a request pays for scoring its own inputs, on Python floats when it is small
(``service.engine.prediction_sets``).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from artifact.conformal import Conformal, read_conformal_file
from artifact.contract import Manifest
from models.conformal import ConformalTable, ScoreRule
from service.engine.prediction_sets import python_rows, row_sets, tensor_sets
from service.engine.shift import Shift

PLANS = 128  # asks whose plan a version keeps (a client may cycle through levels: the least recently used go)


@dataclass(frozen=True)
class DecisionRequest:
    """What a request asks beyond the prediction: a coverage for its sets, a risk for its abstentions, or both."""

    coverage: float | None = None
    max_risk: float | None = None
    score: str | None = None  # the conformal score; the manifest's default when None
    class_conditional: bool = False
    abstain_if_ood: bool = True
    widen_if_shifted: bool = True

    @property
    def asked(self) -> bool:
        return self.coverage is not None or self.max_risk is not None

    def incomplete(self) -> str | None:
        """A set's options without a coverage, or abstain_if_ood off without a max_risk, would be dropped: why."""
        if self.coverage is None and (self.score is not None or self.class_conditional or not self.widen_if_shifted):
            return "conformal_score, class_conditional and widen_if_shifted shape prediction sets: give coverage too"
        if self.max_risk is None and not self.abstain_if_ood:
            return "abstain_if_ood applies to abstentions: give max_risk too"
        return None


@dataclass(frozen=True)
class Decisions:
    """A request's answers: per input a set (label indices, most probable first) and an abstention, each None when
    not asked, with the rule that gave them."""

    sets: list[list[int]] | None
    abstain: list[bool] | None
    coverage: float | None
    score: str | None
    class_conditional: bool
    max_risk: float | None
    risk_level: float | None  # the manifest's level whose threshold answered max_risk
    confidence_threshold: float | None  # None with max_risk: no threshold meets it, every input abstains
    delta: float | None
    reason: str | None  # why every input abstains, when none could be answered
    abstain_if_ood: bool = True
    exchangeable: list[bool] | None = None  # per input: whether it looks exchangeable with the calibration data
    shift: str | None = None  # why the request's inputs as a whole look shifted (``service.engine.shift``)
    widen_if_shifted: bool = True

    def rules(self) -> dict[str, Any]:
        """The rules applied, named as every protocol reports them (``/predict``'s ``decisions`` object, the OIP
        response ``parameters``; docs/api.md), the fields of what was not asked left out."""
        sets, abstain = self.sets is not None, self.abstain is not None
        rules = {"coverage": self.coverage, "conformal_score": self.score,
                 "class_conditional": self.class_conditional if sets else None, "max_risk": self.max_risk,
                 "risk_level": self.risk_level, "confidence_threshold": self.confidence_threshold,
                 "delta": self.delta, "abstain_if_ood": self.abstain_if_ood if abstain else None,
                 "widen_if_shifted": self.widen_if_shifted if sets else None, "shift": self.shift,
                 "reason": self.reason}
        return {name: value for name, value in rules.items() if value is not None}


@dataclass(frozen=True)
class SetRule:
    """A coverage's sets: the score's rule and each label's threshold (the same for every label unless Mondrian)."""

    rule: ScoreRule
    thresholds: tuple[float, ...]  # [C], for the Python path
    tensor: torch.Tensor  # [C] float64, the same values, for the tensor path


@dataclass(frozen=True)
class Plan:
    """What a version answers to one ask whatever the inputs: the sets' score and rule, the selective level, its
    threshold and why it has none. Computed once per version and ask (``VersionDecisions.plan``), so that a request
    pays only for scoring its own inputs."""

    score: str | None  # the sets' score; None without a coverage
    sets: SetRule | None
    risk_level: float | None
    confidence_threshold: float | None
    reason: str | None


class AnswersDecisions(Protocol):
    """What a version's decisions offer the prediction use case and the protocols: ``VersionDecisions`` here, a
    multi-label version's ``service.engine.label_decisions.LabelRecallDecisions``."""

    outputs: tuple[str, ...]  # the OIP decision outputs it can produce

    def problem(self, ask: DecisionRequest) -> str | None: ...

    def decide(self, probs: torch.Tensor, shift: Shift, ask: DecisionRequest) -> Decisions: ...


class VersionDecisions:
    """A version's conformal tables and selective thresholds, from its manifest's ``conformal`` section and file."""

    outputs = ("prediction_set", "set_size", "abstain", "exchangeable")

    def __init__(self, section: Conformal, document: dict, num_classes: int) -> None:
        self.section = section
        self.tables: dict[str, ConformalTable] = {}
        for name in section.scores:
            rule = ScoreRule(name, section.raps_penalty, section.raps_free_ranks) if name == "raps" else \
                ScoreRule(name)
            per_class = tuple(torch.tensor(s, dtype=torch.float64) for s in document["per_class"][name]) \
                if section.class_conditional else ()
            self.tables[name] = ConformalTable(rule, torch.tensor(document["scores"][name], dtype=torch.float64),
                                               per_class)
        self.thresholds = {float(level): value for level, value in document["selective"]["thresholds"].items()}
        self.num_classes = num_classes
        self.plan = functools.lru_cache(maxsize=PLANS)(self._plan)  # per instance: a reloaded version starts afresh

    @classmethod
    def load(cls, folder: Path, manifest: Manifest) -> VersionDecisions | None:
        """The version's decisions, or None when its manifest has no conformal part (exported before format 1.6)."""
        if manifest.conformal is None:
            return None
        document = read_conformal_file(folder, manifest.conformal, len(manifest.labels))
        return cls(manifest.conformal, document, len(manifest.labels))

    def problem(self, ask: DecisionRequest) -> str | None:
        """Why this version cannot answer ``ask`` (a request error), or None."""
        low, high = self.section.coverage_range
        if ask.coverage is not None and not low <= ask.coverage <= high:
            return f"coverage must be in [{low}, {high}] for this version, got {ask.coverage}"
        if ask.score is not None and ask.score not in self.tables:
            return f"conformal_score {ask.score!r} is not calibrated for this version; it has {list(self.tables)}"
        if ask.class_conditional and not self.section.class_conditional:
            return "this version has no class-conditional calibration"
        return None

    def _plan(self, ask: DecisionRequest) -> Plan:
        """The input-free part of the answer to ``ask`` (one this version can answer: ``problem`` is None)."""
        score, sets = None, None
        if ask.coverage is not None:
            score = ask.score or self.section.default_score
            table = self.tables[score]
            if not ask.class_conditional:
                table = ConformalTable(table.rule, table.marginal)
            thresholds = table.thresholds(ask.coverage, self.num_classes)  # [C] float64
            sets = SetRule(table.rule, tuple(thresholds.tolist()), thresholds)
        level, threshold, reason = None, None, None
        if ask.max_risk is not None:
            level, threshold, reason = self.selective_rule(ask.max_risk)
        return Plan(score, sets, level, threshold, reason)

    def decide(self, probs: torch.Tensor, shift: Shift, ask: DecisionRequest) -> Decisions:
        """The answers for a request's served probabilities ``[n, C]`` and its shift signals."""
        plan = self.plan(ask)
        rows = python_rows(probs)  # None: large, or not finite; scored on tensors
        sets, rule = None, plan.sets
        if rule is not None and shift.population is not None and ask.widen_if_shifted:
            sets = every_label(probs)
        elif rule is not None:
            sets = row_sets(rows, rule.rule, rule.thresholds) if rows is not None else \
                tensor_sets(probs, rule.rule, rule.tensor)
        abstain = None
        exchangeable = shift.exchangeable
        if ask.max_risk is not None:
            confidence = [max(row) for row in rows] if rows is not None else probs.max(dim=1).values.tolist()  # [n]
            threshold = plan.confidence_threshold
            abstain = [threshold is None or c < threshold or (not fits and ask.abstain_if_ood)
                       for c, fits in zip(confidence, exchangeable, strict=True)]
        return Decisions(sets, abstain, ask.coverage, plan.score, ask.class_conditional, ask.max_risk, plan.risk_level,
                         plan.confidence_threshold, self.section.selective_delta if abstain is not None else None,
                         plan.reason, ask.abstain_if_ood, exchangeable, shift.population, ask.widen_if_shifted)

    def selective_rule(self, max_risk: float) -> tuple[float | None, float | None, str | None]:
        """(the level used, its confidence threshold, why every input abstains): the largest level <= ``max_risk``."""
        levels = [level for level in self.thresholds if level <= max_risk + 1e-12]
        if not levels:
            return None, None, (f"max_risk {max_risk} is below the smallest risk level this version was calibrated "
                                f"for ({min(self.thresholds)}): every input abstains")
        level = max(levels)
        threshold = self.thresholds[level]
        if threshold is None or math.isnan(threshold):
            return level, None, (f"no confidence threshold keeps the error rate of answered inputs at or below {level} "
                                 f"with probability {1 - self.section.selective_delta:g} on this version's "
                                 "calibration split: every input abstains")
        return level, float(threshold), None


def every_label(probs: torch.Tensor) -> list[list[int]]:
    """Each input's set of every label, most probable first: what a set promises nothing narrower than."""
    return probs.argsort(dim=1, descending=True, stable=True).tolist()  # [n, C]
