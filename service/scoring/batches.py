"""Batches as engines hand them to the scorer (a dict of NumPy arrays, a pandas DataFrame, an Arrow table) turned
into keyed inputs, and the scorer's lines turned back into columns of the same kind, one row per input.

A batch's inputs are in one of these columns, the first found:

- ``input``: a ``/predict`` input as JSON (``{"text": ...}``, ``{"image_base64": ...}``, ``{"pixels": ...}``), as the
  file readers write them (``service.scoring.inputs``);
- ``text``: texts; ``pixels``: arrays in the model's layout (``[C, H, W]``, or ``[H, W]`` for one channel) in [0, 1];
- ``image``: PNG or JPEG bytes; ``path``: image files, read where the scorer runs.

``key`` (optional) names each row in the lines (its position in the batch otherwise); ``error`` and ``status``
(optional) mark a row already known bad, answered with that error."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from pydantic import TypeAdapter, ValidationError

from service.api.protocol import RequestInput
from service.engine.modalities.base import EncodedImage, InputDecoder, Loc, PixelValues, RawInput, Text
from service.errors import ApiError

INPUT_COLUMNS = ("input", "text", "pixels", "image", "path")
REQUEST_INPUT = TypeAdapter(RequestInput)


class Input(Protocol):
    """What one input becomes for the model's decoder, given where it sits in its request."""

    def raw(self, loc: Loc) -> RawInput: ...


Item = tuple[str, Input | ApiError]  # (key, the input, or why it cannot be one)


@dataclass(frozen=True)
class TextValue:
    text: str

    def raw(self, loc: Loc) -> RawInput:
        return Text(self.text, [*loc, "text"])


@dataclass(frozen=True)
class Pixels:
    values: Any  # an array or nested lists

    def raw(self, loc: Loc) -> RawInput:
        return PixelValues(self.values, [*loc, "pixels"])


@dataclass(frozen=True)
class ImageBytes:
    data: bytes

    def raw(self, loc: Loc) -> RawInput:
        return EncodedImage(self.data, [*loc, "image"])


def probe_input(decoder: InputDecoder) -> Input:
    """An input any version of the decoder's modality takes: a short text, or black pixels of the model's shape."""
    if decoder.modality == "text":
        return TextValue("a probe")
    return Pixels(np.zeros(decoder.tensor.dims, dtype=np.float32))


def column_values(batch: Any) -> dict[str, Sequence[Any]]:
    """The batch's columns as sequences of Python values (arrays stay arrays)."""
    if hasattr(batch, "schema") and hasattr(batch, "to_pylist"):  # an Arrow table
        return {name: batch.column(name).to_pylist() for name in batch.column_names}
    if hasattr(batch, "columns") and hasattr(batch, "index"):  # a pandas DataFrame
        return {str(name): batch[name].tolist() for name in batch.columns}
    if isinstance(batch, Mapping):
        return {str(name): list(values) for name, values in batch.items()}
    raise TypeError(f"a batch is a dict of arrays, a pandas DataFrame or an Arrow table, not {type(batch).__name__}")


def from_columns(batch: Any) -> list[Item]:
    """The batch's rows as keyed inputs."""
    columns = column_values(batch)
    kind = next((name for name in INPUT_COLUMNS if name in columns), None)
    if kind is None:
        raise ValueError(f"a batch needs one of the columns {', '.join(INPUT_COLUMNS)}; it has {', '.join(columns)}")
    values = columns[kind]
    keys = columns.get("key") or [str(i) for i in range(len(values))]
    errors = columns.get("error") or [None] * len(values)
    statuses = columns.get("status") or [None] * len(values)
    return [(str(key), ApiError(int(status or 422), error) if error is not None else as_input(kind, value))
            for key, value, error, status in zip(keys, values, errors, statuses, strict=True)]


def as_input(kind: str, value: Any) -> Input | ApiError:
    if value is None:
        return ApiError(422, f"the row has no {kind}")
    if kind == "text":
        return TextValue(str(value))
    if kind == "pixels":
        return Pixels(value)
    if kind == "image":
        return ImageBytes(bytes(value))
    if kind == "path":
        try:
            return ImageBytes(Path(value).read_bytes())
        except OSError as exc:
            return ApiError(400, f"cannot read the image {str(value)[:200]!r}: {exc.strerror or exc}")
    try:
        return REQUEST_INPUT.validate_json(value)
    except ValidationError as exc:
        return ApiError(422, f"not a /predict input: {str(exc).splitlines()[0][:300]}")


def to_columns(lines: list[dict[str, Any]], columns: list[str], like: Any) -> Any:
    """The lines as columns of ``like``'s kind: ``columns`` first, then any other field a line has; a field a line
    lacks is None (null) in its row."""
    names = list(dict.fromkeys([*columns, *(name for line in lines for name in line)]))
    if hasattr(like, "schema") and hasattr(like, "to_pylist"):  # an Arrow table: its class builds the answer
        return type(like).from_pylist([{name: line.get(name) for name in names} for line in lines])
    values = {name: objects([line.get(name) for line in lines]) for name in names}
    if hasattr(like, "columns") and hasattr(like, "index"):  # a DataFrame, indexed as the batch was
        return type(like)(values, index=like.index)
    return values


def objects(values: list[Any]) -> np.ndarray:
    """An object array holding each value as it is (lists and dicts included, never broadcast into more axes)."""
    out = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        out[i] = value
    return out
