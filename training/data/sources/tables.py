"""A user's labelled texts as a ``TextDataset``: a CSV / TSV / JSON lines / Parquet file, a folder of ``train.*``
(``val.*``, ``test.*``) files, a ``datasets`` folder written by ``save_to_disk``, or a hub id ``owner/name``."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from training.data.sources.errors import DataError
from training.data.sources.folders import entries
from training.data.sources.labels import LabelLimit, Table, resolve_labels
from training.data.sources.splits import SPLIT_ALIASES, SPLITS, check_classes, overlap_warnings, plan_splits
from training.data.sources.summary import DataSummary, Lengths, TextStats, class_counts, label_kind
from training.data.sources.text_files import TEXT_FORMATS, missing_columns, read_file
from training.data.texts import TextDataset, TextSplit

_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def _import_datasets(what: str) -> Any:
    try:
        import datasets
    except ImportError as exc:
        raise DataError(f"reading {what} needs the `datasets` library: pip install datasets") from exc
    return datasets


def _datasets_table(rows: Any, source: str, columns: tuple[str, str], datasets: Any, limit: LabelLimit | None
                    ) -> Table:
    missing_columns(source, rows.column_names, columns)
    data = rows.select_columns(list(columns)).to_dict()
    feature = rows.features[columns[1]]
    names = list(feature.names) if isinstance(feature, datasets.ClassLabel) else None
    table = Table(source, data[columns[0]], data[columns[1]], class_names=names)
    if limit is not None:
        limit.add_table(table)
    return table


def _datasets_splits(loaded: Any, source: str, columns: tuple[str, str], datasets: Any, limit: LabelLimit | None
                     ) -> tuple[dict[str, Table], list[str]]:
    """A ``Dataset`` (train only) or a ``DatasetDict``'s train / validation (val, dev) / test splits."""
    if isinstance(loaded, datasets.Dataset):
        return {"train": _datasets_table(loaded, source, columns, datasets, limit)}, []
    tables: dict[str, Table] = {}
    names: dict[str, str] = {}
    ignored = []
    for name in loaded:
        split = SPLIT_ALIASES.get(str(name).lower())
        if split is None:
            ignored.append(str(name))
            continue
        if split in tables:
            raise DataError(f"{source} has both the splits {names[split]!r} and {name!r}: keep one")
        names[split] = str(name)
        tables[split] = _datasets_table(loaded[name], f"{source} split {name!r}", columns, datasets, limit)
    if "train" not in tables:
        raise DataError(f"{source} has no train split; its splits are {list(loaded)}")
    notes = [f"splits ignored (not train, validation or test): {', '.join(ignored)}"] if ignored else []
    return tables, notes


def _split_files(folder: Path, columns: tuple[str, str], limit: LabelLimit | None
                 ) -> tuple[dict[str, Table], list[str]]:
    found: dict[str, Path] = {}
    ignored = []
    for path in entries(folder):
        if not path.is_file() or path.suffix.lower() not in TEXT_FORMATS:
            continue
        split = SPLIT_ALIASES.get(path.stem.lower())
        if split is None:
            ignored.append(path.name)
        elif split in found:
            raise DataError(f"{folder} holds two {split} files, {found[split].name} and {path.name}: keep one")
        else:
            found[split] = path
    if "train" not in found:
        raise DataError(f"{folder} holds no train file (train.csv, .tsv, .jsonl, .json or .parquet, with optional "
                        f"val.* or validation.* and test.*) and is no `datasets` folder written by save_to_disk"
                        + (f"; it holds {ignored}" if ignored else ""))
    notes = [f"files ignored (not train, val, validation or test): {', '.join(ignored)}"] if ignored else []
    return {split: read_file(found[split], columns, limit) for split in SPLITS if split in found}, notes


def _text_source(path: str, columns: tuple[str, str], limit: LabelLimit | None
                 ) -> tuple[dict[str, Table], str, list[str]]:
    """The given splits of ``path`` (split -> Table), a description of the source, and notes for the summary;
    ``limit`` refuses it as soon as its labels pass the most distinct labels it may hold."""
    local = Path(path).expanduser()
    if local.is_file():
        return {"train": read_file(local, columns, limit)}, f"file {local}", []
    if local.is_dir():
        if (local / "dataset_dict.json").is_file() or (local / "state.json").is_file():
            datasets = _import_datasets(str(local))
            try:
                loaded = datasets.load_from_disk(str(local))
            except Exception as exc:  # datasets raises several kinds for a damaged folder
                raise DataError(f"{local} looks like a `datasets` folder but cannot be loaded "
                                f"({type(exc).__name__}: {exc})") from exc
            tables, notes = _datasets_splits(loaded, str(local), columns, datasets, limit)
            return tables, f"datasets folder {local} (save_to_disk)", notes
        tables, notes = _split_files(local, columns, limit)
        return tables, f"folder {local} ({', '.join(Path(t.source).name for t in tables.values())})", notes
    if not _HUB_ID.fullmatch(path) or Path(path).suffix.lower() in TEXT_FORMATS:
        raise DataError(f"{path} does not exist: give a CSV, TSV, JSON lines or Parquet file, a folder of train.* "
                        "(val.*, test.*) files, a `datasets` folder written by save_to_disk, or a hub id owner/name")
    datasets = _import_datasets(f"the hub dataset {path}")
    try:
        loaded = datasets.load_dataset(path)
    except Exception as exc:  # no network, no such dataset, no access: all the same to the user
        raise DataError(f"{path!r} is no local file or folder, and loading it from the Hugging Face hub failed "
                        f"({type(exc).__name__}: {exc}). Check the path, or the dataset id and the internet "
                        "connection (or download it and give the local folder)") from exc
    tables, notes = _datasets_splits(loaded, f"hub dataset {path}", columns, datasets, limit)
    return tables, f"hub dataset {path}", notes


def _text_value(raw: Any, table: Table, i: int, column: str) -> str:
    if raw is None or (isinstance(raw, float | np.floating) and math.isnan(raw)):
        raise DataError(f"{table.where(i)}: the text is missing; every row needs a text")
    if not isinstance(raw, str):
        raise DataError(f"{table.where(i)}: the text is {raw!r} ({type(raw).__name__}), not a string: is {column!r} "
                        "the texts' column? --text-column names it")
    if not raw.strip():
        raise DataError(f"{table.where(i)}: the text is empty or only whitespace; fill it in or remove the row")
    return raw


def _shared_class_names(tables: dict[str, Table], labels: list[str] | None) -> tuple[list[str] | None, str | None]:
    """Read a ClassLabel column by its names when they are the checkpoint's (or there are no others); else by index."""
    names = [t.class_names for t in tables.values() if t.class_names is not None]
    usable = bool(names) and all(n == names[0] for n in names) and len(names) == len(tables)
    if usable and (labels is None or set(names[0]) <= set(labels)):
        return (list(names[0]) if labels is None else labels), "the dataset's ClassLabel names"
    for table in tables.values():
        table.class_names = None
    return labels, None


def load_text_table(path: str, text_column: str = "text", label_column: str = "label",
                    labels: list[str] | None = None, val_fraction: float = 0.1, test_fraction: float = 0.1,
                    seed: int = 0, max_characters: int | None = None,
                    count_tokens: Callable[[list[str]], list[int]] | None = None, max_length: int | None = None,
                    label_limit: LabelLimit | None = None, multi_label: bool = False,
                    label_columns: list[str] | None = None) -> tuple[TextDataset, DataSummary]:
    """Labelled texts as a ``TextDataset``: a file (.csv, .tsv, .jsonl, .json as JSON lines, .parquet), a folder of
    ``train.*`` and optional ``val.*`` / ``validation.*`` / ``test.*`` files, a ``save_to_disk`` folder, or a hub id.
    A split not given is carved out of train. ``count_tokens`` counts the tokens of texts already cut to
    ``max_characters``, as the tokenizer would without truncation (special tokens included): the summary then says
    how many exceed ``max_length``. Texts are not cut here: the pipeline cuts and truncates them. ``label_limit``
    refuses the data as soon as its labels pass the most distinct labels it may hold. ``multi_label``: several labels
    per row, in ``label_column`` as lists or one 0/1 column per name of ``label_columns``
    (``training.data.sources.multi_label``)."""
    if multi_label or label_columns:
        data, summary = _multi_label_table(path, text_column, label_column, labels, (val_fraction, test_fraction),
                                           seed, label_columns)
        summary.texts = _text_stats({"train": data.train, "val": data.val, "test": data.test}, max_characters,
                                    count_tokens, max_length)
        return data, summary
    columns = (text_column, label_column)
    tables, source, notes = _text_source(path, columns, label_limit)
    for split, table in tables.items():
        if not table.items:
            raise DataError(f"{table.source} holds no rows: the {split} split needs examples")
    given_labels, class_label = _shared_class_names(tables, labels)
    texts = {split: [_text_value(raw, t, i, text_column) for i, raw in enumerate(t.items)]
             for split, t in tables.items()}
    indices, label_names, kind = resolve_labels(list(tables.values()), given_labels)
    targets = dict(zip(tables, indices, strict=True))
    if class_label is not None and labels is None:
        kind = f"class indices named by {class_label}"
    check_classes(targets["train"], label_names, tables["train"].source,
                  f"add rows of each class to {tables['train'].source}")
    plan = plan_splits(targets, len(label_names), val_fraction, test_fraction, seed,
                       {split: t.source for split, t in tables.items()})
    splits = {name: TextSplit([texts[source][int(i)] for i in rows], targets[source][rows])
              for name, (source, rows) in plan.rows.items()}
    data = TextDataset(splits["train"], splits["val"], splits["test"], label_names)
    warnings = notes + overlap_warnings({n: s.texts for n, s in splits.items()},
                                        {n: s.labels for n, s in splits.items()}, "texts")
    summary = DataSummary(source, label_names, label_kind(kind, f"column {label_column!r}"),
                          {name: class_counts(s.labels, len(label_names)) for name, s in splits.items()},
                          plan.origins, texts=_text_stats(splits, max_characters, count_tokens, max_length),
                          warnings=warnings)
    return data, summary


def _text_stats(splits: dict[str, TextSplit], max_characters: int | None,
                count_tokens: Callable[[list[str]], list[int]] | None, max_length: int | None) -> TextStats:
    characters = Lengths.of([len(t) for s in splits.values() for t in s.texts])
    cut = None if max_characters is None else \
        {name: sum(len(t) > max_characters for t in s.texts) for name, s in splits.items()}
    tokens = truncated = None
    if count_tokens is not None:
        counts = {}
        for name, s in splits.items():
            counts[name] = list(count_tokens([t if max_characters is None else t[:max_characters] for t in s.texts]))
            if len(counts[name]) != len(s):
                raise ValueError(f"count_tokens returned {len(counts[name])} counts for {len(s)} texts")
        tokens = Lengths.of([c for values in counts.values() for c in values])
        if max_length is not None:
            truncated = {name: sum(c > max_length for c in values) for name, values in counts.items()}
    return TextStats(characters, max_characters, cut, tokens, max_length, truncated)


def _multi_label_table(path: str, text_column: str, label_column: str, labels: list[str] | None,
                       fractions: tuple[float, float], seed: int, label_columns: list[str] | None
                       ) -> tuple[TextDataset, DataSummary]:
    """``load_text_table`` of multi-label data: the label lists of ``label_column``, or the 0/1 columns
    ``label_columns`` (the source read once per column, its rows zipped)."""
    from training.data.sources.multi_label import multi_label_dataset, multi_label_summary

    per_column = [_text_source(path, (text_column, column), None) for column in label_columns or [label_column]]
    tables, source, _ = per_column[0]
    if label_columns:
        for split, table in tables.items():
            table.labels = [tuple(t[0][split].labels[i] for t in per_column) for i in range(len(table.items))]
    for split, table in tables.items():
        if not table.items:
            raise DataError(f"{table.source} holds no rows: the {split} split needs examples")
    texts = {split: [_text_value(raw, t, i, text_column) for i, raw in enumerate(t.items)]
             for split, t in tables.items()}
    data, counts, kind, origins = multi_label_dataset(tables, texts, labels, label_columns, fractions, seed)
    what = f"columns {', '.join(label_columns)}" if label_columns else f"column {label_column!r}"
    return data, multi_label_summary(source, data.labels, kind, counts, origins, what)
