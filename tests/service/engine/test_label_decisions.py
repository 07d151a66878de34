"""A multi-label version's label sets alone (``service.engine.label_decisions.LabelRecallDecisions``), without a
server: read from a real label-recall file, checked as the artifact loader checks it; ``decide`` answers what
``models.label_recall`` gives; the single-label asks are refused with the reason; each coverage's threshold is
computed once."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from artifact.multi_label import LABEL_RECALL_FILE, LabelRecall, read_label_recall_file
from models.label_recall import RecallTable
from service.engine.decisions import DecisionRequest
from service.engine.label_decisions import RULE, LabelRecallDecisions
from service.engine.shift import Shift

LABELS = 5


def calibration() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    probs = torch.rand(200, LABELS, generator=generator)  # [n, K]
    return probs, (torch.rand(200, LABELS, generator=generator) < probs).long()


def written(folder: Path) -> tuple[LabelRecallDecisions, RecallTable]:
    """A label-recall file as the export writes it, read back as the server reads it."""
    table = RecallTable.fit(*calibration())
    (folder / LABEL_RECALL_FILE).write_text(json.dumps({"probabilities": table.probabilities.tolist(),
                                                        "weights": table.weights.tolist()}))
    section = LabelRecall(n=table.n, entries=len(table.probabilities), split="random")
    return LabelRecallDecisions(section, read_label_recall_file(folder, section)), table


def test_decide_gives_the_sets_of_the_table(tmp_path: Path) -> None:
    decisions, table = written(tmp_path)
    probs = torch.rand(9, LABELS, generator=torch.Generator().manual_seed(2))  # [N, K]
    for coverage in (0.5, 0.8, 0.9, 0.99):
        answer = decisions.decide(probs, Shift([False] * 9, None), DecisionRequest(coverage=coverage))
        assert answer.sets == table.sets(probs, coverage)
        assert answer.abstain is None
        assert answer.rules() == {"coverage": coverage, "conformal_score": RULE, "class_conditional": False,
                                  "widen_if_shifted": True}
    calm = Shift([False] * 9, None)
    sizes = [len(s) for s in decisions.decide(probs, calm, DecisionRequest(coverage=0.99)).sets or []]
    assert max(sizes) > min(len(s) for s in decisions.decide(probs, calm, DecisionRequest(coverage=0.5)).sets or [])
    shifted = decisions.decide(probs, Shift([True] * 9, "9 of 9 flagged"), DecisionRequest(coverage=0.5))
    assert all(len(s) == LABELS for s in shifted.sets or []) and shifted.exchangeable == [False] * 9


def test_each_coverage_threshold_is_computed_once(tmp_path: Path) -> None:
    decisions, _ = written(tmp_path)
    probs = torch.rand(3, LABELS)
    for _ in range(3):
        decisions.decide(probs, Shift([False] * 3, None), DecisionRequest(coverage=0.9))
    assert decisions.threshold.cache_info().misses == 1 and decisions.threshold.cache_info().hits == 2


@pytest.mark.parametrize(("ask", "reason"), [
    (DecisionRequest(max_risk=0.1), "answers no max_risk"),
    (DecisionRequest(coverage=0.9, score="aps"), "single-label prediction sets"),
    (DecisionRequest(coverage=0.9, class_conditional=True), "single-label prediction sets"),
    (DecisionRequest(coverage=0.2), r"coverage must be in \[0.5, 0.999\]"),
])
def test_what_it_cannot_answer_is_named(tmp_path: Path, ask: DecisionRequest, reason: str) -> None:
    decisions, _ = written(tmp_path)
    assert decisions.problem(DecisionRequest(coverage=0.9)) is None
    problem = decisions.problem(ask)
    assert problem is not None and re.search(reason, problem), problem


@pytest.mark.parametrize(("document", "reason"), [
    ({"probabilities": [0.5, 0.2], "weights": [1.0, 1.0]}, "ascending"),
    ({"probabilities": [0.2, 1.5], "weights": [1.0, 1.0]}, "ascending values in"),
    ({"probabilities": [0.2, 0.5], "weights": [1.0, 0.0]}, r"weight must be in \(0, 1\]"),
    ({"probabilities": [0.2], "weights": [1.0]}, "must hold 2 values"),
])
def test_a_broken_file_is_refused_with_the_reason(tmp_path: Path, document: dict, reason: str) -> None:
    (tmp_path / LABEL_RECALL_FILE).write_text(json.dumps(document))
    with pytest.raises(ValueError, match=reason):
        read_label_recall_file(tmp_path, LabelRecall(n=2, entries=2, split="random"))
