"""The inputs of an offline run, read from a file or a folder, each with its key:

- an image folder: PNG / JPEG files, searched recursively, keyed by their path in the folder (read when scored);
- a JSONL file: one ``/predict`` input per line (``{"text": ...}``, ``{"image_base64": ...}``, ``{"pixels": ...}``)
  with an optional ``"id"``, keyed by the id, else the line number;
- a CSV or Parquet file: texts in a column, keyed by an id column, else the row number.

A record the server would refuse (a line that is not UTF-8 or not JSON, or nested too deep; a CSV row that is not
UTF-8) is an item with its error. Records are read from any position (a byte offset of a JSONL or CSV file, a row of a
Parquet file, a file of a folder), so that a file is read in segments that engines read in parallel
(``service.scoring.segments``)."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any, BinaryIO

from pydantic import TypeAdapter, ValidationError

from service.api.protocol import RequestInput
from service.engine.modalities.base import EncodedImage, Loc, RawInput
from service.errors import ApiError
from service.scoring.batches import Input, Item, TextValue

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg"}
INPUT = TypeAdapter(RequestInput)
Record = tuple[int, Item | None]  # where the record starts, and its item (None: a blank line, no input)


@dataclass(frozen=True)
class ImageFile:
    """An image of an input folder, read when it is decoded."""

    path: Path

    def raw(self, loc: Loc) -> RawInput:
        try:
            return EncodedImage(self.path.read_bytes(), [*loc, "image"])
        except OSError as exc:
            raise ApiError(400, f"cannot read {self.path.name}: {exc.strerror or exc}") from exc


@dataclass(frozen=True)
class Source:
    """An input file or folder, and where a CSV or Parquet file keeps its texts and keys."""

    path: Path
    text_column: str = "text"
    id_column: str | None = None

    @property
    def kind(self) -> str:
        if self.path.is_dir():
            return "folder"
        suffix = self.path.suffix.lower()
        return {".csv": "csv", ".parquet": "parquet"}.get(suffix, "jsonl")


def read_inputs(source: Source) -> Iterator[Item]:
    """Every input of the source, in order."""
    return (item for _, item in records(source) if item is not None)


def records(source: Source, start: int = 0, number: int = 1, count: int | None = None) -> Iterator[Record]:
    """``count`` records (all when None) from position ``start``, the first numbered ``number``."""
    readers = {"folder": folder_records, "csv": csv_records, "parquet": parquet_records, "jsonl": jsonl_records}
    return islice(readers[source.kind](source, start, number), count)


def image_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())


def folder_records(source: Source, start: int, number: int) -> Iterator[Record]:
    files = image_files(source.path)
    for index in range(start, len(files)):
        file = files[index]
        yield index, (str(file.relative_to(source.path)), ImageFile(file))


def jsonl_records(source: Source, start: int, number: int) -> Iterator[Record]:
    with source.path.open("rb") as handle:
        handle.seek(start)
        position = start
        for line, raw in enumerate(handle, start=number):
            yield position, (json_item(line, raw) if raw.strip() else None)
            position += len(raw)


def json_item(line: int, raw: bytes) -> Item:
    try:
        value = json.loads(raw.decode("utf-8"))
        key = str(value.pop("id", line)) if isinstance(value, dict) else str(line)
        return key, INPUT.validate_python(value)
    except UnicodeDecodeError:
        return str(line), ApiError(400, f"line {line} is not UTF-8 text")
    except RecursionError:
        return str(line), ApiError(422, f"line {line} is nested too deeply to be a /predict input")
    except (ValueError, ValidationError) as exc:
        return str(line), ApiError(422, f"line {line} is not a /predict input: {str(exc).splitlines()[0][:300]}")


class TrackedLines:
    """A binary file's lines as text (bytes that are not UTF-8 kept as lone surrogates, so the row that holds them is
    refused, not the file), with the offset of the next line not yet read: a CSV reader reads no further than the
    record it returns, so that offset is where the next record starts."""

    def __init__(self, handle: BinaryIO) -> None:
        self.handle = handle
        self.offset = handle.tell()

    def __iter__(self) -> Iterator[str]:
        for raw in self.handle:
            self.offset += len(raw)
            yield raw.decode("utf-8", errors="surrogateescape")


def csv_header(path: Path) -> list[str]:
    with path.open("rb") as handle:
        return next(csv.reader(TrackedLines(handle)), [])


def csv_records(source: Source, start: int, number: int) -> Iterator[Record]:
    with source.path.open("rb") as handle:
        lines = TrackedLines(handle)
        reader = csv.reader(lines)
        header = next(reader, [])
        if start:
            handle.seek(start)
            lines.offset = start
        row_number = number
        while True:
            position = lines.offset
            row = next(reader, None)
            if row is None:
                return
            if row:  # blank rows are no records (as csv.DictReader skips them)
                yield position, csv_item(source, row_number, dict(zip(header, row, strict=False)))
                row_number += 1


def csv_item(source: Source, row: int, values: dict[str, str]) -> Item:
    key = values.get(source.id_column) if source.id_column else None
    text = values.get(source.text_column) or ""
    if not all(is_utf8(value) for value in (text, key or "")):
        return str(row), ApiError(400, f"row {row} is not UTF-8 text")
    return (key or str(row)), TextValue(text)


def is_utf8(text: str) -> bool:
    """Whether a string read with ``surrogateescape`` held valid UTF-8 only."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def parquet_records(source: Source, start: int, number: int) -> Iterator[Record]:
    import pyarrow.parquet as pq

    columns = [name for name in (source.text_column, source.id_column) if name is not None]
    file = pq.ParquetFile(source.path)
    first = 0  # the row each row group starts at
    for group in range(file.num_row_groups):
        rows = file.metadata.row_group(group).num_rows
        if first + rows > start:
            table = file.read_row_group(group, columns=columns)
            texts = table.column(source.text_column).to_pylist()
            ids = table.column(source.id_column).to_pylist() if source.id_column else [None] * rows
            for offset in range(max(start - first, 0), rows):
                row = first + offset
                yield row, parquet_item(number + row - start, texts[offset], ids[offset])
        first += rows


def parquet_item(row: int, text: Any, key: Any) -> Item:
    return (str(row) if key is None else str(key)), TextValue("" if text is None else str(text))


def columns_of(source: Source) -> list[str] | None:
    """The columns of a CSV or Parquet source (None for any other)."""
    if source.kind == "csv":
        return csv_header(source.path)
    if source.kind == "parquet":
        import pyarrow.parquet as pq

        return list(pq.read_schema(source.path).names)
    return None


def item_row(key: str, item: Input | ApiError) -> dict[str, Any]:
    """An item as a row of a batch the scorer reads back (``service.scoring.batches``)."""
    if isinstance(item, ApiError):
        return {"key": key, "error": str(item), "status": item.status}
    if isinstance(item, TextValue):
        return {"key": key, "text": item.text}
    if isinstance(item, ImageFile):
        return {"key": key, "path": str(item.path.resolve())}
    return {"key": key, "input": item.model_dump_json()}  # type: ignore[attr-defined]
