"""Data a command cannot use is refused early and in a few words: a label column with more distinct labels than the
classes allow stops the reading at the row that passes the limit, naming how many and the first few (never every
count), in every format; a missing column names the flags that name the columns."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from training.data.sources import DataError, LabelLimit, load_image_folder, load_text_table
from training.data.sources.splits import plan_splits


def limit(most: int = 50) -> LabelLimit:
    return LabelLimit(most, "the checkpoint's head has 50 classes", "the column 'label'",
                      " Is 'label' the labels' column? --label-column names it")


def distinct_rows(n: int) -> list[tuple[str, str]]:
    return [(f"text {i}", f"id-{i}") for i in range(n)]


def test_a_csv_is_refused_at_the_row_that_passes_the_limit_before_the_rest_is_read(tmp_path: Path) -> None:
    """Past the limit the file holds bytes that are not UTF-8: reading on to them would be another error, so the
    limit's error shows the reading stopped at row 51."""
    path = tmp_path / "ids.csv"
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["text", "label"])
        writer.writerows(distinct_rows(2000))
    with path.open("ab") as handle:
        handle.write(b"\xff\xfe not text\n")
    with pytest.raises(DataError) as refused:
        load_text_table(str(path), label_limit=limit())
    message = str(refused.value)
    assert message.startswith(f"{path}, row 51 (line 52): more than 50 distinct labels in the column 'label' by this "
                              "row (the checkpoint's head has 50 classes); the first are 'id-0', 'id-1',")
    assert "'id-7', ..." in message and "'id-8'" not in message and "--label-column names it" in message
    assert len(message) < 400
    with pytest.raises(DataError, match="not UTF-8"):  # without a limit the whole file is read
        load_text_table(str(path))


def test_json_lines_parquet_and_datasets_are_refused_past_the_limit(tmp_path: Path) -> None:
    rows = distinct_rows(120)
    jsonl = tmp_path / "ids.jsonl"
    jsonl.write_text("".join(json.dumps({"text": t, "label": y}) + "\n" for t, y in rows) + "{not json\n")
    with pytest.raises(DataError, match=r"ids.jsonl, row 51 \(line 51\): more than 50 distinct labels"):
        load_text_table(str(jsonl), label_limit=limit())
    pq.write_table(pa.table({"text": [t for t, _ in rows], "label": [y for _, y in rows]}), tmp_path / "ids.parquet")
    with pytest.raises(DataError, match=r"ids.parquet, row 51: more than 50 distinct labels"):
        load_text_table(str(tmp_path / "ids.parquet"), label_limit=limit())
    saved = tmp_path / "saved"
    datasets.Dataset.from_dict({"text": [t for t, _ in rows], "label": [y for _, y in rows]}).save_to_disk(saved)
    with pytest.raises(DataError, match=r"saved, row 51: more than 50 distinct labels"):
        load_text_table(str(saved), label_limit=limit())


def test_labels_within_the_limit_read_as_before(tmp_path: Path) -> None:
    path = tmp_path / "few.csv"
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["text", "label"])
        writer.writerows((f"text {i}", f"c{i % 3}") for i in range(60))
    data, _ = load_text_table(str(path), label_limit=limit(3))
    assert data.labels == ["c0", "c1", "c2"]


def test_image_class_folders_past_the_limit_are_refused_before_any_image_is_read(tmp_path: Path) -> None:
    for i in range(6):
        (tmp_path / f"class-{i}").mkdir()
        (tmp_path / f"class-{i}" / "0.png").write_bytes(b"not an image")  # never decoded: refused first
    folders = LabelLimit(4, "the checkpoint's head has 4 classes", "the class folders",
                         "; each class folder is a class")
    with pytest.raises(DataError, match=r"class folder .*class-4: more than 4 distinct labels in the class folders"):
        load_image_folder(tmp_path, 3, 8, 8, None, label_limit=folders)


def test_an_empty_carved_split_is_said_in_a_few_words_however_many_classes() -> None:
    labels = torch.arange(5000)  # 5,000 classes of one example each
    with pytest.raises(DataError) as refused:
        plan_splits({"train": labels}, 5000, 0.1, 0.1, 0, {"train": "ids.csv"})
    assert "its 5000 classes have 1 to 1 training examples each, 5000 of them fewer than 3" in str(refused.value)
    assert len(str(refused.value)) < 400


def test_a_missing_column_names_the_flags(tmp_path: Path) -> None:
    path = tmp_path / "sources.csv"
    path.write_text("sentence,source\na tweet,tweet\n")
    with pytest.raises(DataError) as refused:
        load_text_table(str(path))
    message = str(refused.value)
    assert "has no column 'text'; its columns are ['sentence', 'source']" in message
    assert "--text-column" in message and "--label-column" in message and "text_column" not in message
