"""A multi-label version's label sets with a recall guarantee (docs/method.md, "Multi-label models: label sets with a
recall guarantee"): from the served path's probabilities on the calibration split, which the export carves from
validation and uses for nothing else, the true labels' probabilities and weights (``models.label_recall``), written as
the version's ``label_recall.json`` and described by the manifest's ``multi_label.recall`` (``artifact.multi_label``);
and what the sets give on the test split at a few coverages."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from artifact.multi_label import LABEL_RECALL_FILE, LabelRecall
from models.label_recall import RecallTable, recall_figures
from training.data.calibration_split import LABEL_SETS, calibration_description
from training.export.label_paths import LabelPath
from training.loading import AnySplit

TEST_COVERAGES = (0.8, 0.9, 0.95)  # the coverages the test split's figures report


def write_label_recall(path: LabelPath, calibration: AnySplit, share: float, seed: int, folder: Path
                       ) -> tuple[LabelRecall, RecallTable]:
    """Write ``label_recall.json`` into the staged version ``folder`` from the served ``path``'s probabilities on the
    calibration split, and return the manifest's section with the table it holds."""
    table = RecallTable.fit(path.probabilities(calibration, seed + 5), calibration.labels)  # [n, C] draws
    document = {"probabilities": table.probabilities.tolist(), "weights": table.weights.tolist()}
    (folder / LABEL_RECALL_FILE).write_text(json.dumps(document) + "\n")
    return LabelRecall(n=table.n, entries=len(table.probabilities),
                       split=calibration_description(calibration, share, LABEL_SETS)), table


def label_sets_on_test(table: RecallTable, probs: torch.Tensor, labels: torch.Tensor) -> dict[str, Any]:
    """At each of ``TEST_COVERAGES``: the threshold, the test split's mean recall (with its standard error) and mean
    set size, from the served path's probabilities ``[N, C]`` on test and its true labels ``[N, C]``."""
    return {f"{coverage:g}": {"threshold": table.threshold(coverage),
                              **recall_figures(table.sets(probs, coverage), labels)}
            for coverage in TEST_COVERAGES}
