"""Labels as class indices: one rule for every split of a source, class names or integer indices, given by the
checkpoint or read from the data, with an error naming the row of each label that fits neither."""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from training.data.sources.errors import DataError, preview

_INTEGER = re.compile(r"[+-]?\d+")


@dataclass
class Table:
    """One split as read, before any check: its inputs (texts, or image paths), raw labels, and where each row is."""

    source: str  # named in errors: the file, or the dataset and split
    items: list[Any]
    labels: list[Any]
    lines: list[int] | None = None  # the line of the file each row starts on (CSV, JSON lines)
    class_names: list[str] | None = None  # the names of a ``datasets`` ClassLabel label column
    places: list[str] | None = None  # each row's place, when not a row of a file (image class folders)

    def where(self, i: int) -> str:
        if self.places is not None:
            return self.places[i]
        line = f" (line {self.lines[i]})" if self.lines is not None else ""
        return f"{self.source}, row {i + 1}{line}"


@dataclass
class LabelLimit:
    """The most distinct labels the data may hold (``why``: the head's class count, or ``data.max_classes`` without a
    head), counted as rows are read: a wrong label column (an id, the texts) is refused at the row that passes the
    limit, before the rest of the file is read, split and summarised."""

    most: int
    why: str
    column: str  # what holds the labels, as the error names it
    hint: str = ""  # what to check, ending the error
    seen: dict[str, None] = field(default_factory=dict)  # the distinct labels in the order met

    def add(self, raw: Any, where: Callable[[], str]) -> None:
        """Count one row's raw label; ``where`` names the row, called only for the error."""
        key = raw.strip() if isinstance(raw, str) else repr(raw)
        if key in self.seen:
            return
        self.seen[key] = None
        if len(self.seen) > self.most:
            first = ", ".join(repr(label) for label in list(self.seen)[:8])
            raise DataError(f"{where()}: more than {self.most} distinct labels in {self.column} by this row "
                            f"({self.why}); the first are {first}, ...{self.hint}")

    def add_table(self, table: Table) -> None:
        """Count a table read whole (a Parquet file, a ``datasets`` split, the class folders)."""
        for i, raw in enumerate(table.labels):
            self.add(raw, lambda i=i: table.where(i))


def _label_value(raw: Any, table: Table, i: int) -> int | str:
    """One label as read: an int (a class index) or a stripped string (a class name, or an integer written as text,
    as every CSV label is)."""
    if isinstance(raw, str):
        if not raw.strip():
            raise DataError(f"{table.where(i)}: the label is empty; every row needs a label")
        return raw.strip()
    if raw is None or (isinstance(raw, float | np.floating) and math.isnan(raw)):
        raise DataError(f"{table.where(i)}: the label is missing; every row needs a label")
    if isinstance(raw, bool | np.bool_):
        raise DataError(f"{table.where(i)}: the label {raw!r} is a boolean; write class indices (0, 1) or class names")
    if isinstance(raw, float | np.floating) and float(raw).is_integer():
        raw = int(raw)
    if not isinstance(raw, int | np.integer):
        raise DataError(f"{table.where(i)}: the label {raw!r} is neither a class name nor an integer class index")
    value = int(raw)
    if table.class_names is None:
        return value
    if not 0 <= value < len(table.class_names):
        hint = " (-1 means no label: an unlabelled split?)" if value == -1 else ""
        raise DataError(f"{table.where(i)}: the label {value} is outside its ClassLabel's "
                        f"0..{len(table.class_names) - 1}{hint}; its names are {preview(table.class_names)}")
    return table.class_names[value]


def _is_index(value: int | str) -> bool:
    return isinstance(value, int) or bool(_INTEGER.fullmatch(value))


def resolve_labels(tables: list[Table], labels: list[str] | None) -> tuple[list[torch.Tensor], list[str], str]:
    """Every table's labels as class indices int64 [N] into one list of class names, and how they were read.

    One rule for all tables together: with ``labels`` given, the values are class names when every value is one of
    them, else integer indices when every value is an integer (written as text or not), else names (and the first
    unknown one is the error). Without ``labels``, integers 0..max named by their number, else the sorted names."""
    if labels is not None and not labels:
        raise DataError("the checkpoint gives no class names (an empty id2label)")
    values = [[_label_value(raw, table, i) for i, raw in enumerate(table.labels)] for table in tables]
    every = [v for row in values for v in row]
    all_indices = all(_is_index(v) for v in every)
    if labels is not None:
        known = {name: i for i, name in enumerate(labels)}
        all_names = bool(every) and all(isinstance(v, str) and v in known for v in every)
        by_index = all_indices and not all_names
        kind = "integer class indices into the given labels" if by_index else "class names among the given labels"
    elif all_indices:
        for table, row in zip(tables, values, strict=True):
            for i, v in enumerate(row):
                if int(v) < 0:
                    raise DataError(f"{table.where(i)}: the label {v!r} is negative; class indices start at 0")
        labels = [str(k) for k in range(max(int(v) for v in every) + 1)] if every else []
        known = {name: i for i, name in enumerate(labels)}
        kind, by_index = "integer class indices from the data, named by their number", True
    else:
        labels = sorted({str(v) for v in every})
        known = {name: i for i, name in enumerate(labels)}
        kind, by_index = "class names from the data, sorted", False
    out = []
    for table, row in zip(tables, values, strict=True):
        index = [_index_of(v, table, i, labels, known, by_index) for i, v in enumerate(row)]
        out.append(torch.tensor(index, dtype=torch.long))  # [N]
    return out, list(labels), kind


def _index_of(value: int | str, table: Table, i: int, labels: list[str], known: dict[str, int], by_index: bool) -> int:
    if by_index:
        k = int(value)
        if not 0 <= k < len(labels):
            raise DataError(f"{table.where(i)}: the label {value!r} is not a class index in 0..{len(labels) - 1}; "
                            f"the known labels are {preview(labels)}")
        return k
    name = str(value)
    if name not in known:
        close = [n for n in labels if n.lower() == name.lower()] or difflib.get_close_matches(name, labels, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise DataError(f"{table.where(i)}: the label {value!r} is not one of the known labels {preview(labels)}"
                        f"{hint}")
    return known[name]
