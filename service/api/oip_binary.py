"""Binary tensor outputs of the Open Inference Protocol (its ``binary_tensor_data`` extension, as Triton and its
clients speak it).

An output is sent binary when the request asks: ``parameters.binary_data_output: true`` on the request sets the
default for every output, ``parameters.binary_data`` on a requested output overrides it for that one. A binary
output loses its ``data`` and gains ``parameters.binary_data_size``; the body is the JSON header followed by the
outputs' bytes in order (little-endian; BOOL one byte per element; BYTES each element a 4-byte length, then its
bytes), and the ``Inference-Header-Content-Length`` header gives the JSON header's length."""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np
from fastapi.responses import JSONResponse, Response

from service.api.oip import HEADER_LENGTH, parameters_of
from service.errors import invalid

NUMPY = {"FP32": "<f4", "INT64": "<i8", "BOOL": "|u1"}


def binary_outputs(body: dict[str, Any], names: list[str]) -> set[str]:
    """Which of ``names`` (the outputs the response carries) the request wants binary. Checked before inference."""
    default = _flag(parameters_of(body, ["body", "parameters"]), "binary_data_output", ["body", "parameters"])
    chosen = set(names) if default else set()
    for i, item in enumerate(body.get("outputs") or []):
        loc: list[str | int] = ["body", "outputs", i, "parameters"]
        flag = _flag(parameters_of(item, loc), "binary_data", loc)
        if flag is not None:
            (chosen.add if flag else chosen.discard)(item["name"])
    return chosen


def _flag(parameters: dict[str, Any], name: str, loc: list[str | int]) -> bool | None:
    value = parameters.get(name)
    if value is not None and not isinstance(value, bool):
        raise invalid(f"{name} must be true or false, got {value!r}", [*loc, name])
    return value


def tensor_bytes(datatype: str, data: list[Any]) -> bytes:
    if datatype == "BYTES":
        encoded = [str(item).encode("utf-8") for item in data]
        return b"".join(struct.pack("<I", len(item)) + item for item in encoded)
    return np.asarray(data, dtype=NUMPY[datatype]).tobytes()


def infer_response(response: dict[str, Any], binary: set[str]) -> Response:
    """JSON when no output is binary; otherwise the JSON header with the binary outputs' bytes after it."""
    if not binary:
        return JSONResponse(response)
    chunks = []
    outputs = []
    for output in response["outputs"]:
        if output["name"] in binary:
            chunk = tensor_bytes(output["datatype"], output["data"])
            chunks.append(chunk)
            output = {k: v for k, v in output.items() if k != "data"}
            output["parameters"] = {**output.get("parameters", {}), "binary_data_size": len(chunk)}
        outputs.append(output)
    header = json.dumps({**response, "outputs": outputs}, separators=(",", ":")).encode()
    return Response(header + b"".join(chunks), media_type="application/octet-stream",
                    headers={HEADER_LENGTH: str(len(header))})
