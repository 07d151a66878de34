"""A user's multi-label texts (several labels per row) as a ``TextDataset`` whose splits' labels are 0/1 indicators
``[N, C]`` float32: either one column of label lists (a JSON list in JSON lines or Parquet; in a CSV / TSV cell a JSON
list or names joined by ``|``, ``;`` or ``,``; an empty list or cell means no label), or one 0/1 column per label
(``label_columns``, the labels named by their columns). Val and test are carved out of train when not given, stratified
by each row's first label (rows without one form a stratum of their own)."""

from __future__ import annotations

import json
import math
import re
from typing import Any

import numpy as np
import torch

from training.data.sources.errors import DataError, preview
from training.data.sources.labels import Table
from training.data.sources.splits import plan_splits
from training.data.sources.summary import DataSummary
from training.data.texts import TextDataset, TextSplit

_SEPARATOR = re.compile(r"[|;,]")
_TRUE, _FALSE = {"1", "1.0", "true", "yes"}, {"0", "0.0", "false", "no", ""}


def label_list(raw: Any, table: Table, i: int) -> list[str]:
    """One row's labels as names (stripped, in the order written)."""
    if raw is None or (isinstance(raw, float) and math.isnan(raw)):
        return []
    if isinstance(raw, str):
        text = raw.strip()
        if text.startswith("["):
            try:
                raw = json.loads(text)
            except json.JSONDecodeError as exc:
                raise DataError(f"{table.where(i)}: the labels {text!r} are not a JSON list ({exc.msg})") from exc
        else:
            return [part.strip() for part in _SEPARATOR.split(text) if part.strip()]
    if isinstance(raw, list | tuple | np.ndarray):
        return [str(v).strip() for v in raw if str(v).strip()]
    raise DataError(f"{table.where(i)}: the labels {raw!r} are not a list of label names")


def indicator(raw: Any, table: Table, i: int, column: str) -> bool:
    """One 0/1 cell of a label's column."""
    if isinstance(raw, bool | np.bool_):
        return bool(raw)
    if isinstance(raw, int | float | np.integer | np.floating) and float(raw) in (0.0, 1.0):
        return float(raw) == 1.0
    if isinstance(raw, str) and raw.strip().lower() in _TRUE | _FALSE:
        return raw.strip().lower() in _TRUE
    raise DataError(f"{table.where(i)}: {column!r} is {raw!r}; a label's column holds 0 or 1 (true or false)")


def indicators(rows: list[list[str]], names: list[str], table: Table) -> torch.Tensor:
    """0/1 [N, C] float32 of rows of label names over ``names``, the first unknown name the error."""
    known = {name: c for c, name in enumerate(names)}
    out = torch.zeros(len(rows), len(names), dtype=torch.float32)  # [N, C]
    for i, row in enumerate(rows):
        for name in row:
            if name not in known:
                raise DataError(f"{table.where(i)}: the label {name!r} is not one of the known labels {preview(names)}")
            out[i, known[name]] = 1.0
    return out


def multi_label_targets(tables: dict[str, Table], labels: list[str] | None, columns: list[str] | None
                        ) -> tuple[dict[str, torch.Tensor], list[str], str]:
    """Each table's indicators [N, C], the label names and how they were read. ``tables`` hold label lists, or (with
    ``columns``) one tuple of 0/1 cells per row, in ``columns`` order."""
    if columns:
        if labels is not None and list(labels) != list(columns):
            raise DataError(f"--label-columns {columns} must be the checkpoint's labels {labels} in its order")
        out = {split: torch.tensor([[float(indicator(v, t, i, c)) for v, c in zip(row, columns, strict=True)]
                                    for i, row in enumerate(t.labels)], dtype=torch.float32).reshape(-1, len(columns))
               for split, t in tables.items()}
        return out, list(columns), f"one 0/1 column per label ({', '.join(columns)})"
    rows = {split: [label_list(raw, t, i) for i, raw in enumerate(t.labels)] for split, t in tables.items()}
    names = list(labels) if labels is not None else sorted({n for r in rows.values() for row in r for n in row})
    if not names:
        raise DataError("no row holds a label: a multi-label column lists each row's labels")
    kind = "lists of label names among the given labels" if labels is not None else "lists of label names, sorted"
    return {split: indicators(rows[split], names, tables[split]) for split in tables}, names, kind


def strata(targets: torch.Tensor) -> torch.Tensor:
    """Each row's stratum for carving splits [N]: its first label, or C for a row without one."""
    has = targets.bool()  # [N, C]
    first = has.float().argmax(-1)  # [N]
    return torch.where(has.any(-1), first, torch.full_like(first, targets.shape[1]))


def multi_label_dataset(tables: dict[str, Table], texts: dict[str, list[str]], labels: list[str] | None,
                        columns: list[str] | None, fractions: tuple[float, float], seed: int
                        ) -> tuple[TextDataset, dict[str, list[int]], str, dict[str, str]]:
    """The dataset, the positives per label of each split, how the labels were read and where each split came from."""
    targets, names, kind = multi_label_targets(tables, labels, columns)
    never = [n for n, count in zip(names, targets["train"].sum(0).tolist(), strict=True) if count == 0]
    if never:
        raise DataError(f"no training row has the label(s) {', '.join(map(repr, never))} in "
                        f"{tables['train'].source}: every label needs positive examples in train")
    plan = plan_splits({split: strata(t) for split, t in targets.items()}, len(names) + 1, *fractions, seed,
                       {split: t.source for split, t in tables.items()})
    splits = {name: TextSplit([texts[source][int(i)] for i in rows], targets[source][rows])
              for name, (source, rows) in plan.rows.items()}
    counts = {name: [int(c) for c in s.labels.sum(0).tolist()] for name, s in splits.items()}
    return TextDataset(splits["train"], splits["val"], splits["test"], names), counts, kind, plan.origins


def multi_label_summary(source: str, names: list[str], kind: str, counts: dict[str, list[int]],
                        origins: dict[str, str], what: str) -> DataSummary:
    """The data summary; its counts are each label's positive rows."""
    carved = {split: origin.replace("stratified by class", "stratified by each row's first label")
              for split, origin in origins.items()}
    return DataSummary(source, names, f"{what} read as {kind} (multi-label: counts are rows with the label)", counts,
                       carved)
