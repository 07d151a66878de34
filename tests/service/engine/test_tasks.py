"""A version's task as the server reads it once from its manifest (``service.engine.tasks``): the summaries, the
per-label outputs, the prediction log's rows, the refusal of abstentions, and multi-label feedback."""

from __future__ import annotations

import json

import pytest
import torch

from artifact.contract import parse_manifest
from models.tasks import MultiLabelSummary
from service.engine.decisions import DecisionRequest
from service.engine.tasks import LABEL_OUTPUTS, label_outcomes, logged_labels, served_task
from tests.service.engine.fakes import LABELS, manifest


def multi_label(thresholds: list[float], temperatures: list[float] | None = None):  # noqa: ANN201
    document = manifest().document()
    section = {"thresholds": thresholds, "threshold_rule": "fixed",
               **({"temperatures": temperatures} if temperatures else {})}
    return parse_manifest({**document, "task": "multi_label", "multi_label": section})


def test_a_single_label_manifest_keeps_the_softmax() -> None:
    task = served_task(manifest())
    assert not task.multi_label and task.label_outputs == {}
    assert task.decisions_refusal(DecisionRequest(coverage=0.9, max_risk=0.1)) is None
    summary = task.summarize(torch.tensor([[[2.0, 0.0]]]), 1.0)
    assert not isinstance(summary, MultiLabelSummary)
    assert task.logged(summary, LABELS) == [(0, "a", pytest.approx(float(summary.confidence[0])))]
    assert task.prediction_fields(summary, LABELS) == [{}]


def test_a_multi_label_manifest_reads_its_thresholds_and_temperatures() -> None:
    task = served_task(multi_label([0.5, 0.9], [1.0, 2.0]))
    assert task.multi_label and task.label_outputs == LABEL_OUTPUTS
    assert "multi-label model answers no max_risk" in (task.decisions_refusal(DecisionRequest(max_risk=0.1)) or "")
    assert task.decisions_refusal(DecisionRequest(coverage=0.9)) is None  # its label sets answer, when calibrated
    logits = torch.tensor([[[2.0, 2.0], [-3.0, 0.5]]])  # [S=1, B=2, C=2]
    summary = task.summarize(logits, 1.0)
    assert isinstance(summary, MultiLabelSummary)
    assert summary.probabilities[0].tolist() == pytest.approx(torch.sigmoid(torch.tensor([2.0, 1.0])).tolist())
    assert summary.predicted.tolist() == [[True, False], [False, False]]  # sigmoid(1) < 0.9
    fields = task.prediction_fields(summary, LABELS)
    assert fields[0]["labels"] == ["a"] and fields[1]["labels"] == [] and set(fields[0]["label_entropy"]) == {"a", "b"}
    rows = task.logged(summary, LABELS)
    assert [json.loads(label) for _, label, _ in rows] == [["a"], []]
    values = task.label_values(summary)
    assert set(values) == set(LABEL_OUTPUTS) and values["predicted"] == [[True, False], [False, False]]


def test_feedback_judges_each_label() -> None:
    assert logged_labels('["a"]') == {"a"} and logged_labels("a") == set()
    assert label_outcomes('["a"]', ["a"], LABELS) == {"a": True, "b": True}
    assert label_outcomes('["a"]', [1], LABELS) == {"a": False, "b": False}
    assert label_outcomes('["a"]', ["b"], None) == {"a": False, "b": False}  # an unloaded version: named labels only
    with pytest.raises(ValueError, match="unknown label 'c'"):
        label_outcomes("[]", ["c"], LABELS)
    with pytest.raises(ValueError, match="label index 5"):
        label_outcomes("[]", [5], LABELS)
