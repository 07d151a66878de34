"""One file of labelled texts as a ``Table``: CSV, TSV, JSON lines (or one JSON array) or Parquet, told apart by
the file's suffix, with an error naming the file and line of anything unreadable."""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from training.data.sources.errors import DataError
from training.data.sources.labels import LabelLimit, Table

TEXT_FORMATS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet"}


def missing_columns(source: str, columns: Sequence[str], wanted: Sequence[str]) -> None:
    """Fail on the first of the ``wanted`` columns (text, label) that ``source`` lacks, naming the columns it has and
    the flags that name the wanted ones."""
    missing = [c for c in wanted if c not in columns]
    if missing:
        raise DataError(f"{source} has no column {missing[0]!r}; its columns are {list(columns)}. Name the texts' "
                        f"column with --text-column and the labels' with --label-column (now {wanted[0]!r} and "
                        f"{wanted[1]!r})")


def _read_delimited(path: Path, delimiter: str, columns: tuple[str, str], limit: LabelLimit | None) -> Table:
    csv.field_size_limit(2**31 - 1)  # a long document is one field; the default limit is 128 KiB
    try:
        with path.open(newline="", encoding="utf-8-sig") as handle:
            reader = csv.reader(handle, delimiter=delimiter)
            header = next(reader, None)
            if header is None:
                raise DataError(f"{path} is empty: expected a header row naming the columns, then one row per example")
            missing_columns(str(path), header, columns)
            text_at, label_at = header.index(columns[0]), header.index(columns[1])
            texts, labels, lines = [], [], []
            start = reader.line_num + 1
            for record in reader:
                if record:  # a blank line is no row
                    texts.append(record[text_at] if text_at < len(record) else None)
                    labels.append(record[label_at] if label_at < len(record) else None)
                    lines.append(start)
                    if limit is not None:
                        limit.add(labels[-1], lambda: f"{path}, row {len(texts)} (line {lines[-1]})")
                start = reader.line_num + 1
    except UnicodeDecodeError as exc:
        raise DataError(f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start}): save it as UTF-8") from exc
    except csv.Error as exc:
        kind = "TSV" if delimiter == "\t" else "CSV"
        raise DataError(f"{path}, line {reader.line_num}: not readable as {kind} ({exc})") from exc
    except OSError as exc:
        raise DataError(f"{path}: cannot be read ({exc.strerror or exc})") from exc
    return Table(str(path), texts, labels, lines=lines)


def _read_json(path: Path, columns: tuple[str, str], limit: LabelLimit | None) -> Table:
    """JSON lines (one object per line); a ``.json`` file holding one array of objects is read too."""
    try:
        content = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DataError(f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start}): save it as UTF-8") from exc
    except OSError as exc:
        raise DataError(f"{path}: cannot be read ({exc.strerror or exc})") from exc
    records: list[tuple[int, Any]] = []
    if content.lstrip().startswith("["):
        try:
            records = list(enumerate(json.loads(content), start=1))
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}, line {exc.lineno}: not valid JSON ({exc.msg})") from exc
        lines = None
    else:
        for number, line in enumerate(content.splitlines(), start=1):
            if line.strip():
                try:
                    records.append((number, json.loads(line)))
                except json.JSONDecodeError as exc:
                    raise DataError(f"{path}, line {number}: not valid JSON ({exc.msg}); expected one JSON object "
                                    "per line") from exc
                if limit is not None and isinstance(records[-1][1], dict):
                    limit.add(records[-1][1].get(columns[1]),
                              lambda n=number: f"{path}, row {len(records)} (line {n})")
        lines = [number for number, _ in records]
    for i, (number, record) in enumerate(records):
        if not isinstance(record, dict):
            raise DataError(f"{path}, row {i + 1} (line {number}): expected a JSON object of columns, got "
                            f"{type(record).__name__}")
    keys = list(dict.fromkeys(key for _, record in records for key in record))
    missing_columns(str(path), keys, columns)
    table = Table(str(path), [r.get(columns[0]) for _, r in records], [r.get(columns[1]) for _, r in records],
                  lines=lines)
    if limit is not None and lines is None:  # one JSON array, parsed whole
        limit.add_table(table)
    return table


def _read_parquet(path: Path, columns: tuple[str, str], limit: LabelLimit | None) -> Table:
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise DataError(f"reading {path} needs pyarrow: pip install pyarrow") from exc
    try:
        schema = pq.read_schema(path)
        missing_columns(str(path), schema.names, columns)
        table = pq.read_table(path, columns=list(columns))
    except DataError:
        raise
    except Exception as exc:  # pyarrow raises several kinds for a file that is not Parquet
        raise DataError(f"{path} is not a readable Parquet file ({type(exc).__name__}: {exc})") from exc
    read = Table(str(path), table.column(columns[0]).to_pylist(), table.column(columns[1]).to_pylist(),
                 class_names=_parquet_class_names(schema, columns[1]))
    if limit is not None:
        limit.add_table(read)
    return read


def _parquet_class_names(schema: Any, column: str) -> list[str] | None:
    """The ClassLabel names that ``datasets`` stores in a Parquet file's metadata, if any."""
    try:
        meta = json.loads((schema.metadata or {}).get(b"huggingface", b"{}"))
        feature = meta.get("info", {}).get("features", {}).get(column, {})
        return list(feature["names"]) if feature.get("_type") == "ClassLabel" else None
    except (ValueError, AttributeError, KeyError, TypeError):
        return None


def read_file(path: Path, columns: tuple[str, str], limit: LabelLimit | None = None) -> Table:
    """The file as a ``Table`` of its ``columns`` (text, label), read by the format its suffix names; ``limit`` refuses
    it at the row whose label passes the most distinct labels it may hold."""
    kind = TEXT_FORMATS.get(path.suffix.lower())
    if kind is None:
        raise DataError(f"cannot tell the format of {path}: name it .csv, .tsv, .jsonl, .json (JSON lines) or .parquet")
    if kind in ("csv", "tsv"):
        return _read_delimited(path, "," if kind == "csv" else "\t", columns, limit)
    return _read_json(path, columns, limit) if kind == "jsonl" else _read_parquet(path, columns, limit)
