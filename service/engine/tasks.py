"""What a served version's task changes, decided once when its artifact loads (``served_task``): how its sampled
rows are summarised (``models.tasks``: a softmax over the classes, or a sigmoid per label with the manifest's
per-label temperatures and thresholds), the per-label outputs every protocol adds for a multi-label model, what its
prediction log keeps and what ``/feedback`` takes for it, and why it answers no abstentions (its ``coverage`` gives
label sets: ``service.engine.label_decisions``).
Every protocol and the feedback route read the task from here, never the manifest's ``task`` itself."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import torch

from artifact.contract import Manifest
from models.tasks import MULTI_LABEL, SOFTMAX, MultiLabelSummary, Task, task_for
from models.uncertainty import UncertaintySummary
from service.engine.decisions import DecisionRequest
from service.errors import shown

# per-input outputs of a multi-label model, one value per label ([n, C]): OIP name -> datatype
LABEL_OUTPUTS = {"predicted": "BOOL", "label_entropy": "FP32", "label_mutual_information": "FP32"}
NO_ABSTENTIONS = ("a multi-label model answers no max_risk: abstentions are calibrated for one label per input (a "
                  "softmax); its coverage gives label sets with a recall guarantee, and each label's probability and "
                  "threshold say how sure each decision is")


@dataclass(frozen=True)
class ServedTask:
    """A version's task: ``maths`` summarises its rows; the rest is empty or None for a single-label model."""

    maths: Task = SOFTMAX

    @property
    def multi_label(self) -> bool:
        return self.maths.kind == MULTI_LABEL

    @property
    def label_outputs(self) -> dict[str, str]:
        """The per-label outputs (name -> OIP datatype, shape [n, C]) the protocols add to a prediction."""
        return dict(LABEL_OUTPUTS) if self.multi_label else {}

    def summarize(self, logits: torch.Tensor, temperature: float | torch.Tensor) -> UncertaintySummary:
        """One summary of sampled logits [S, B, C] (``models.tasks``)."""
        return self.maths.summarize(logits, temperature)

    def label_values(self, summary: UncertaintySummary) -> dict[str, list[list[Any]]]:
        """Each per-label output's values [n][C]."""
        if not isinstance(summary, MultiLabelSummary):
            return {}
        return {"predicted": summary.predicted.tolist(), "label_entropy": summary.label_entropy.tolist(),
                "label_mutual_information": summary.label_mutual_information.tolist()}

    def prediction_fields(self, summary: UncertaintySummary, labels: list[str]) -> list[dict[str, Any]]:
        """Per input, what ``/predict`` adds to its prediction: the labels predicted and each label's entropy and
        mutual information (nothing for a single-label model)."""
        values = self.label_values(summary)
        if not values:
            return [{} for _ in range(int(summary.confidence.shape[0]))]
        return [{"labels": [name for name, on in zip(labels, predicted, strict=True) if on],
                 "label_entropy": dict(zip(labels, entropy, strict=True)),
                 "label_mutual_information": dict(zip(labels, mutual, strict=True))}
                for predicted, entropy, mutual in zip(values["predicted"], values["label_entropy"],
                                                      values["label_mutual_information"], strict=True)]

    def logged(self, summary: UncertaintySummary, labels: list[str]) -> list[tuple[int, str, float]]:
        """The prediction log's rows (class index, label, confidence); a multi-label model logs the labels it
        predicted as a JSON list in the label's place, which ``/feedback`` compares the true labels with."""
        indices, confidence = summary.prediction.tolist(), summary.confidence.tolist()
        if not isinstance(summary, MultiLabelSummary):
            return [(c, labels[c], p) for c, p in zip(indices, confidence, strict=True)]
        sets = [json.dumps([name for name, on in zip(labels, row, strict=True) if on])
                for row in summary.predicted.tolist()]
        return list(zip(indices, sets, confidence, strict=True))

    def decisions_refusal(self, ask: DecisionRequest) -> str | None:
        """Why the version's task cannot answer ``ask`` whatever its calibration (None: it may)."""
        return NO_ABSTENTIONS if self.multi_label and ask.max_risk is not None else None


def served_task(manifest: Manifest) -> ServedTask:
    """The task of a version's manifest (earlier manifests: single-label)."""
    section = manifest.multi_label
    if manifest.task != MULTI_LABEL or section is None:
        return ServedTask()
    return ServedTask(task_for(MULTI_LABEL, section.temperatures, section.thresholds))


def logged_labels(logged: str) -> set[str]:
    """The labels a multi-label prediction log row holds (``ServedTask.logged``)."""
    try:
        values = json.loads(logged)
    except json.JSONDecodeError:
        return set()
    return {str(v) for v in values} if isinstance(values, list) else set()


def label_outcomes(logged: str, truth: list[str | int], labels: list[str] | None) -> dict[str, bool]:
    """Multi-label feedback: per label, whether the logged prediction (``ServedTask.logged``) decided it right
    against the true labels (names or indices into ``labels``; ``labels`` None: the version is no longer loaded, so
    only the labels named by either are judged). ``ValueError`` names a label the version does not have."""
    names = set()
    for value in truth:
        if isinstance(value, int):
            if labels is None or not 0 <= value < len(labels):
                raise ValueError(f"label index {value} is not one of the version's "
                                 f"{'unknown' if labels is None else f'0..{len(labels) - 1}'}")
            names.add(labels[value])
        elif labels is not None and value not in labels:
            raise ValueError(f"unknown label {shown(value)}; labels: {shown_labels(labels)}")
        else:
            names.add(value)
    predicted = logged_labels(logged)
    judged = labels if labels is not None else sorted(names | predicted)
    return {name: (name in predicted) == (name in names) for name in judged}


def shown_labels(labels: list[str], limit: int = 20) -> str:
    """A version's labels as an error lists them: the first ``limit`` and how many there are (a tagger's thousands of
    labels are not echoed)."""
    if len(labels) <= limit:
        return str(labels)
    return f"{labels[:limit]}... ({len(labels):,} labels)"
