"""A multi-label classifier end to end, as a user runs it: a tiny BERT saved with ``problem_type:
multi_label_classification``, labelled data with several labels per row (a JSON-lines column of label lists, or a CSV
with one 0/1 column per label), one ``calibrate`` command each, and the exported versions' manifests."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from artifact.contract import MANIFEST, parse_manifest
from tests.training.calibrate.test_calibrate import calibrate
from tests.training.calibrate.tiny_checkpoints import TOPICS, multi_label_texts, save_multi_label_checkpoint


def write_jsonl(path: Path, rows: list[tuple[str, list[str]]]) -> Path:
    path.write_text("".join(json.dumps({"text": text, "tags": labels}) + "\n" for text, labels in rows))
    return path


def write_columns_csv(path: Path, rows: list[tuple[str, list[str]]]) -> Path:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["text", *TOPICS])
        writer.writerows([text, *(int(t in labels) for t in TOPICS)] for text, labels in rows)
    return path


@pytest.fixture(scope="module")
def multi_label_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two multi-label versions: label lists (the checkpoint's problem_type says multi-label) and 0/1 columns."""
    tmp = tmp_path_factory.mktemp("multi-label")
    rows = multi_label_texts(150, 1)
    bert = str(save_multi_label_checkpoint(tmp / "ckpt" / "bert"))
    calibrate(tmp, "tags", bert, write_jsonl(tmp / "tags.jsonl", rows), "--label-column", "tags",
              "--set", "distil.depth_candidates=[1]")
    calibrate(tmp, "tag-columns", bert, write_columns_csv(tmp / "tags.csv", rows), "--label-columns",
              ",".join(TOPICS), "--set", "distil.depth_candidates=[1]", "--set", "task.thresholds=fixed",
              "--set", "task.temperature=per_label")
    return tmp


def manifest_of(repo: Path, name: str) -> dict:
    return json.loads((repo / "repo" / name / "1" / MANIFEST).read_text())


def test_the_manifest_says_the_task_thresholds_and_temperatures(multi_label_repo: Path) -> None:
    tags = parse_manifest(manifest_of(multi_label_repo, "tags"))
    assert tags.task == "multi_label" and tags.labels == TOPICS and tags.format_version == "1.7"
    assert tags.multi_label is not None and tags.multi_label.threshold_rule == "f1"
    assert len(tags.multi_label.thresholds) == 3 and all(0 < t < 1 for t in tags.multi_label.thresholds)
    assert tags.multi_label.temperature_rule in ("one", "per_label") and len(tags.multi_label.label_ece or []) == 3
    assert tags.ood.score == "mds" and tags.conformal is None and tags.method == "director"
    assert tags.reference is not None and tags.reference.ece is not None
    columns = parse_manifest(manifest_of(multi_label_repo, "tag-columns"))
    assert columns.multi_label is not None and columns.multi_label.thresholds == [0.5, 0.5, 0.5]
    assert columns.multi_label.temperature_rule == "per_label" and len(columns.multi_label.temperatures or []) == 3
    config = (multi_label_repo / "runs" / "tag-columns" / "calibrate.yaml").read_text()
    assert "kind: multi_label" in config and "label_columns:" in config


def test_the_results_page_lists_each_label(multi_label_repo: Path) -> None:
    page = (multi_label_repo / "repo" / "tags" / "README.md").read_text()
    assert "multi-label" in page and all(f"| {t} |" in page for t in TOPICS)
