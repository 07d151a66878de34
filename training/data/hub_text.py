"""Text tasks from the Hugging Face hub through the ``datasets`` library, for users with internet: IMDB (binary
sentiment of full movie reviews) and CoLA (GLUE: grammatical acceptability of single sentences).

Neither can be downloaded here, so the loaders take ``data_files`` as well: local copies of the splits (parquet,
JSON lines or CSV with the hub's column names), which is how the tests exercise them and how a user with a mirror
runs them offline. Splits: the hub's training split is cut into train and a seeded validation part; the test part
is the hub's labelled evaluation split (IMDB ``test``; CoLA ``validation``, because GLUE's CoLA ``test`` has no
labels).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from training.data.texts import SENTIMENT_LABELS, TextDataset, TextSplit


@dataclass(frozen=True)
class HubTextTask:
    path: str  # hub dataset id
    config: str | None  # hub configuration (GLUE's task name)
    text_column: str
    label_column: str
    train_split: str
    test_split: str  # a split with labels
    labels: tuple[str, ...]
    sentiment: bool  # whether the VADER domain-shift sets (labelled by sentiment) apply


HUB_TEXT_TASKS = {
    "imdb": HubTextTask("stanfordnlp/imdb", None, "text", "label", "train", "test", tuple(SENTIMENT_LABELS), True),
    "cola": HubTextTask("nyu-mll/glue", "cola", "sentence", "label", "train", "validation",
                        ("unacceptable", "acceptable"), False),
}


def _format_of(path: str) -> str:
    suffix = Path(path).suffix.lower()
    formats = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".csv": "csv"}
    if suffix not in formats:
        raise ValueError(f"cannot tell the format of {path!r}: use .parquet, .jsonl, .json or .csv")
    return formats[suffix]


def _split(rows: Any, task: HubTextTask, name: str) -> TextSplit:
    """A ``datasets.Dataset`` split as a ``TextSplit``, checking its columns and labels."""
    columns = set(rows.column_names)
    missing = {task.text_column, task.label_column} - columns
    if missing:
        raise ValueError(f"split {name!r} lacks the columns {sorted(missing)} (has {sorted(columns)})")
    texts = [str(t) for t in rows[task.text_column]]
    labels = torch.tensor([int(v) for v in rows[task.label_column]], dtype=torch.long)
    if labels.numel() and (labels.min() < 0 or labels.max() >= len(task.labels)):
        raise ValueError(f"split {name!r} has labels outside 0..{len(task.labels) - 1} (unlabelled test split?)")
    return TextSplit(texts, labels)


def load_hub_text_task(name: str, val_size: int, split_seed: int = 0, train_limit: int | None = None,
                       test_limit: int | None = None, data_files: dict[str, str] | None = None,
                       cache_dir: str | None = None) -> TextDataset:
    """``name`` (imdb | cola) as a ``TextDataset``: train minus a seeded validation part of ``val_size`` texts,
    and the labelled evaluation split as test. ``data_files`` maps "train" and "test" to local files."""
    try:
        import datasets
    except ImportError as err:
        raise ImportError("the IMDB and CoLA loaders need the `datasets` library: pip install datasets") from err
    if name not in HUB_TEXT_TASKS:
        raise ValueError(f"unknown hub text task {name!r}; choose from {sorted(HUB_TEXT_TASKS)}")
    task = HUB_TEXT_TASKS[name]
    if data_files is not None:
        if set(data_files) != {"train", "test"}:
            raise ValueError(f"data_files must map exactly 'train' and 'test' to files, got {sorted(data_files)}")
        formats = {_format_of(f) for f in data_files.values()}
        if len(formats) != 1:
            raise ValueError(f"data_files mix formats: {sorted(formats)}")
        loaded = datasets.load_dataset(formats.pop(), data_files=data_files, cache_dir=cache_dir)
        train_rows, test_rows = loaded["train"], loaded["test"]
    else:
        loaded = datasets.load_dataset(task.path, task.config, cache_dir=cache_dir)
        train_rows, test_rows = loaded[task.train_split], loaded[task.test_split]
    everything = _split(train_rows, task, "train")
    if val_size >= len(everything):
        raise ValueError(f"val_size {val_size} leaves no training data ({len(everything)} texts)")
    order = torch.randperm(len(everything), generator=torch.Generator().manual_seed(split_seed))
    val = everything.subset(order[:val_size])
    train = everything.subset(order[val_size:])
    test = _split(test_rows, task, "test")
    return TextDataset(train.head(train_limit), val, test.head(test_limit), list(task.labels))
