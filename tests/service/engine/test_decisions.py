"""A version's decisions alone (``service.engine.decisions.VersionDecisions``), without a server: ``decide`` answers
what the calibration tables and the selective thresholds give, computed directly from ``models.conformal`` and the
risk levels, for a request small enough for Python floats and one large enough for tensors; and what depends only on
the ask (thresholds, risk level) is computed once per ask."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from artifact.conformal import Conformal
from models.conformal import ConformalTable, ScoreRule
from service.engine.decisions import PLANS, DecisionRequest, VersionDecisions
from service.engine.prediction_sets import PYTHON_ELEMENTS
from service.engine.shift import BATCH_ALPHA, Shift, binomial_tail, check_shift
from service.observability.drift import Drift

CLASSES = 10
LEVELS = [0.05, 0.1, 0.2, 0.3]
THRESHOLDS: dict[str, float | None] = {"0.05": None, "0.1": 0.8, "0.2": 0.5, "0.3": 0.25}  # 0.05: none meets it


def unshifted(flags: list[bool]) -> Shift:
    """Inputs with these OOD flags in a request and live traffic that look in-distribution."""
    return Shift(list(flags), None)


def calibrated() -> tuple[VersionDecisions, dict[str, ConformalTable]]:
    """A version calibrated on 300 random inputs for every score, per class too, and its tables built here."""
    generator = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(300, CLASSES, generator=generator) * 2, dim=1)
    labels = torch.randint(0, CLASSES, (300,), generator=generator)
    rules = {"lac": ScoreRule("lac"), "aps": ScoreRule("aps"), "raps": ScoreRule("raps", 0.02, 1)}
    tables = {name: ConformalTable.fit(probs, labels, rule, True) for name, rule in rules.items()}
    section = Conformal(n=300, split="random", scores=list(rules), default_score="lac", raps_penalty=0.02,
                        raps_free_ranks=1, class_conditional=True, selective_delta=0.1, risk_levels=LEVELS)
    document: dict[str, Any] = {
        "scores": {name: t.marginal.tolist() for name, t in tables.items()},
        "per_class": {name: [s.tolist() for s in t.per_class] for name, t in tables.items()},
        "selective": {"thresholds": THRESHOLDS}}
    return VersionDecisions(section, document, CLASSES), tables


def expected_sets(tables: dict[str, ConformalTable], probs: torch.Tensor, ask: DecisionRequest, coverage: float
                  ) -> list[list[int]]:
    table = tables[ask.score or "lac"]
    return (table if ask.class_conditional else ConformalTable(table.rule, table.marginal)).sets(probs, coverage)


def expected_abstain(probs: torch.Tensor, flags: list[bool], ask: DecisionRequest, max_risk: float) -> list[bool]:
    level = max((float(k) for k in THRESHOLDS if float(k) <= max_risk), default=None)
    threshold = None if level is None else THRESHOLDS[str(level)]
    return [threshold is None or c < threshold or (flag and ask.abstain_if_ood)
            for c, flag in zip(probs.max(dim=1).values.tolist(), flags, strict=True)]


ASKS = [DecisionRequest(coverage=0.9), DecisionRequest(coverage=0.8, score="aps", class_conditional=True),
        DecisionRequest(coverage=0.95, score="raps"), DecisionRequest(max_risk=0.25),
        DecisionRequest(max_risk=0.12, abstain_if_ood=False), DecisionRequest(coverage=0.9, max_risk=0.3),
        DecisionRequest(max_risk=0.07), DecisionRequest(max_risk=0.01)]


@pytest.mark.parametrize("inputs", [1, 7, PYTHON_ELEMENTS // CLASSES + 1, 64])  # Python floats, then tensors
def test_decide_answers_what_the_tables_and_thresholds_give(inputs: int) -> None:
    decisions, tables = calibrated()
    generator = torch.Generator().manual_seed(inputs)
    probs = torch.softmax(torch.randn(inputs, CLASSES, generator=generator) * 2, dim=1).float()  # as served
    flags = [i % 3 == 0 for i in range(inputs)]
    for ask in ASKS:
        decided = decisions.decide(probs, unshifted(flags), ask)
        if ask.coverage is None:
            assert decided.sets is None and decided.score is None
        else:
            assert decided.sets == expected_sets(tables, probs, ask, ask.coverage)
            assert decided.score == (ask.score or "lac")
        if ask.max_risk is None:
            assert decided.abstain is None and decided.delta is None and decided.risk_level is None
        else:
            assert decided.abstain == expected_abstain(probs, flags, ask, ask.max_risk)
            assert decided.delta == 0.1


def test_the_risk_level_its_threshold_and_why_none() -> None:
    decisions, _ = calibrated()
    probs = torch.full((2, CLASSES), 1.0 / CLASSES)
    lower = decisions.decide(probs, unshifted([False, False]), DecisionRequest(max_risk=0.25))
    assert (lower.risk_level, lower.confidence_threshold, lower.reason) == (0.2, 0.5, None)  # the level below
    unmet = decisions.decide(probs, unshifted([False, False]), DecisionRequest(max_risk=0.07))
    assert unmet.risk_level == 0.05 and unmet.confidence_threshold is None and unmet.abstain == [True, True]
    assert unmet.reason is not None and "no confidence threshold" in unmet.reason
    below = decisions.decide(probs, unshifted([False, False]), DecisionRequest(max_risk=0.01))
    assert below.risk_level is None and below.reason is not None and "below the smallest risk level" in below.reason


def test_a_probability_that_is_not_finite_is_answered_as_the_tensors_answer() -> None:
    decisions, tables = calibrated()
    probs = torch.softmax(torch.randn(3, CLASSES, generator=torch.Generator().manual_seed(5)), dim=1)
    probs[1, 4] = math.nan
    sets_only, both = DecisionRequest(coverage=0.9, score="aps"), DecisionRequest(coverage=0.9, max_risk=0.3)
    assert decisions.decide(probs, unshifted([False] * 3), sets_only).sets == expected_sets(tables, probs, sets_only,
                                                                                          0.9)
    decided = decisions.decide(probs, unshifted([False] * 3), both)
    assert decided.sets == expected_sets(tables, probs, both, 0.9)
    assert decided.abstain == expected_abstain(probs, [False] * 3, both, 0.3)


def test_what_depends_only_on_the_ask_is_computed_once_per_ask(monkeypatch: pytest.MonkeyPatch) -> None:
    decisions, _ = calibrated()
    computed: list[float] = []
    original = ConformalTable.thresholds

    def counted(self: ConformalTable, coverage: float, num_classes: int) -> torch.Tensor:
        computed.append(coverage)
        return original(self, coverage, num_classes)

    monkeypatch.setattr(ConformalTable, "thresholds", counted)
    probs = torch.softmax(torch.randn(4, CLASSES, generator=torch.Generator().manual_seed(6)), dim=1)
    first = [decisions.decide(probs, unshifted([False] * 4), DecisionRequest(coverage=0.9, max_risk=0.3))
             for _ in range(5)]
    assert computed == [0.9] and all(d == first[0] for d in first)
    decisions.decide(probs, unshifted([False] * 4), DecisionRequest(coverage=0.8))
    assert computed == [0.9, 0.8]
    for i in range(PLANS + 10):  # a client cycling through coverages: the kept plans stay bounded
        decisions.decide(probs, unshifted([False] * 4), DecisionRequest(coverage=0.5 + i / 1000))
    assert decisions.plan.cache_info().currsize == PLANS


def test_the_binomial_tail_is_exact_and_stable() -> None:
    assert binomial_tail(0, 10, 0.05) == 1.0
    assert binomial_tail(1, 1, 0.05) == pytest.approx(0.05)
    assert binomial_tail(2, 3, 0.05) == pytest.approx(3 * 0.05**2 * 0.95 + 0.05**3)
    assert binomial_tail(5000, 10000, 0.05) <= 1e-300  # no overflow, no negative


def test_a_request_is_shifted_by_its_own_flags_or_the_live_drift() -> None:
    """One flagged input of twenty is what in-distribution traffic gives; six of twenty is not; a drifted live window
    shifts every request; the reasons say which."""
    calm = check_shift([True] + [False] * 19, 0.05, None)
    assert calm.population is None and calm.exchangeable == [False] + [True] * 19
    flagged = check_shift([True] * 6 + [False] * 14, 0.05, None)
    assert flagged.population is not None and "6 of the request's 20 inputs" in flagged.population
    assert flagged.exchangeable == [False] * 20 and binomial_tail(6, 20, 0.05) < BATCH_ALPHA
    drifted = check_shift([False] * 3, 0.05, Drift(ks=0.3, psi=1.0, window=1000))
    assert drifted.population is not None and "KS 0.30" in drifted.population
    assert check_shift([False] * 3, 0.05, Drift(ks=0.05, psi=0.01, window=1000)).population is None


def test_a_shifted_request_widens_its_sets_and_abstains() -> None:
    """Population-level shift: every set holds every label (most probable first) unless widen_if_shifted is off, and
    every input abstains under abstain_if_ood; the rules name the shift."""
    decisions, _ = calibrated()
    probs = torch.softmax(torch.tensor([[4.0, 2.0, 1.0] + [0.0] * 7, [0.0] * 7 + [1.0, 2.0, 4.0]]), dim=1)
    shifted = Shift([False, False], "2 of the request's 2 inputs are flagged OOD")
    ask = DecisionRequest(coverage=0.9, max_risk=0.3)
    decided = decisions.decide(probs, shifted, ask)
    assert [s[:3] for s in decided.sets or []] == [[0, 1, 2], [9, 8, 7]] and decided.abstain == [True, True]
    assert all(sorted(s) == list(range(CLASSES)) for s in decided.sets or [])
    assert decided.exchangeable == [False, False] and decided.rules()["shift"] == shifted.population
    kept = decisions.decide(probs, shifted, DecisionRequest(coverage=0.9, max_risk=0.3, abstain_if_ood=False,
                                                            widen_if_shifted=False))
    assert kept.sets == decisions.decide(probs, unshifted([False, False]), ask).sets
    assert kept.abstain == decisions.decide(probs, unshifted([False, False]), ask).abstain
