"""A version's prediction sets and abstentions (docs/method.md, "Acting on uncertainty: prediction sets and
abstentions"): from the served path's probabilities on the calibration split, which the export carves from validation
and uses for nothing else, the sorted nonconformity scores of every rule (``models.conformal``) and the Learn-then-Test
confidence threshold of every risk level (``models.selective``), written as the version's ``conformal.json`` and
described by the manifest's ``conformal`` section (``artifact.conformal``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from artifact.conformal import CONFORMAL_FILE, Conformal
from models.conformal import ConformalTable, ScoreRule
from models.selective import learn_then_test

RISK_LEVELS = tuple(round(0.005 * i, 3) for i in range(1, 101))  # 0.005, 0.01, ..., 0.5


def score_rules(names: list[str], penalty: float, free_ranks: int) -> dict[str, ScoreRule]:
    return {name: ScoreRule(name, penalty, free_ranks) if name == "raps" else ScoreRule(name) for name in names}


def conformal_document(probs: torch.Tensor, labels: torch.Tensor, rules: dict[str, ScoreRule], delta: float
                       ) -> dict[str, Any]:
    """The file's content from the calibration split's served probabilities ``[n, C]`` and labels ``[n]``."""
    tables = {name: ConformalTable.fit(probs, labels, rule, class_conditional=True) for name, rule in rules.items()}
    confidence, prediction = probs.max(dim=1)  # [n] each
    correct = prediction == labels  # [n]
    selective = {f"{risk:g}": learn_then_test(confidence, correct, risk, delta) for risk in RISK_LEVELS}
    return {
        "scores": {name: t.marginal.tolist() for name, t in tables.items()},
        "per_class": {name: [s.tolist() for s in t.per_class] for name, t in tables.items()},
        "selective": {"delta": delta,
                      "thresholds": {k: t.threshold for k, t in selective.items()},
                      "answered": {k: t.answered for k, t in selective.items()},
                      "errors": {k: t.errors for k, t in selective.items()}},
    }


def write_conformal(probs: torch.Tensor, labels: torch.Tensor, names: list[str], default: str, penalty: float,
                    free_ranks: int, delta: float, split: str, folder: Path) -> Conformal:
    """Write ``conformal.json`` into the staged version ``folder`` and return the manifest's section for it."""
    document = conformal_document(probs, labels, score_rules(names, penalty, free_ranks), delta)
    (folder / CONFORMAL_FILE).write_text(json.dumps(document) + "\n")
    return Conformal(n=int(labels.shape[0]), split=split, scores=names, default_score=default,
                     raps_penalty=penalty, raps_free_ranks=free_ranks, class_conditional=True,
                     selective_delta=delta, risk_levels=list(RISK_LEVELS))
