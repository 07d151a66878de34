"""Multi-label tables (``training.data.sources.multi_label``): label lists in several spellings, 0/1 columns, and
the errors a user meets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from training.data.sources import DataError, load_text_table
from training.data.sources.labels import Table
from training.data.sources.multi_label import label_list, strata


def test_label_lists_are_read_in_every_spelling() -> None:
    table = Table("t", [], [])
    assert label_list('["a", "b"]', table, 0) == ["a", "b"]
    assert label_list("a|b", table, 0) == ["a", "b"] and label_list("a, b", table, 0) == ["a", "b"]
    assert label_list("", table, 0) == [] and label_list(None, table, 0) == [] and label_list(["c"], table, 0) == ["c"]
    with pytest.raises(DataError, match="not a JSON list"):
        label_list("[a", table, 0)


def test_a_row_without_labels_has_its_own_stratum() -> None:
    assert strata(torch.tensor([[0.0, 1.0], [0.0, 0.0], [1.0, 1.0]])).tolist() == [1, 2, 0]


def write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_a_list_column_becomes_indicators(tmp_path: Path) -> None:
    rows = [{"text": f"text {i}", "label": ["a", "b"][: i % 3]} for i in range(60)]
    data, summary = load_text_table(str(write(tmp_path / "d.jsonl", rows)), multi_label=True)
    assert data.labels == ["a", "b"] and data.train.labels.shape[1] == 2 and data.train.labels.dtype == torch.float32
    assert len(data.train) + len(data.val) + len(data.test) == 60
    assert "multi-label" in summary.label_kind


def test_unknown_labels_and_bad_cells_are_named(tmp_path: Path) -> None:
    rows = [{"text": f"text {i}", "label": ["a"]} for i in range(30)]
    with pytest.raises(DataError, match="'a' is not one of the known labels"):
        load_text_table(str(write(tmp_path / "d.jsonl", rows)), labels=["x", "y"], multi_label=True)
    (tmp_path / "c.csv").write_text("text,a,b\n" + "".join(f"t{i},1,maybe\n" for i in range(30)))
    with pytest.raises(DataError, match="'b' is 'maybe'; a label's column holds 0 or 1"):
        load_text_table(str(tmp_path / "c.csv"), label_columns=["a", "b"])
    (tmp_path / "e.csv").write_text("text,a,b\n" + "".join(f"t{i},1,0\n" for i in range(30)))
    with pytest.raises(DataError, match=r"no training row has the label\(s\) 'b'"):
        load_text_table(str(tmp_path / "e.csv"), label_columns=["a", "b"])
