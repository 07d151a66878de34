"""Open Inference Protocol v2 (KServe / Triton HTTP) tensors <-> the server's requests and results.

Inputs: ``pixels`` FP32 ``[-1, C, H, W]`` (or ``text`` BYTES ``[-1]``, refused by image models); JSON data
(flat or nested) or the binary tensor extension (``Inference-Header-Content-Length``). Parameters:
``n_samples`` and ``seed``. Outputs (JSON): ``probabilities`` FP32 ``[N, K]``, ``confidence``,
``predictive_entropy``, ``expected_entropy``, ``mutual_information``, ``ood_score`` FP32 ``[N]``,
``is_ood`` BOOL ``[N]``, ``label`` BYTES ``[N]``, ``class_index`` INT64 ``[N]``."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import torch

from service.errors import bad_input, invalid
from service.images import check_values
from service.serving import Outcome

HEADER_LENGTH = "inference-header-content-length"
DTYPES = {"FP32": np.float32, "FP64": np.float64, "FP16": np.float16, "UINT8": np.uint8}
OUTPUTS = ("probabilities", "confidence", "predictive_entropy", "expected_entropy", "mutual_information",
           "ood_score", "is_ood", "label", "class_index")


def parse_body(raw: bytes, header_length: str | None) -> tuple[dict[str, Any], bytes]:
    """The JSON part and the binary tail of an infer request."""
    if header_length is not None:
        if not header_length.isdigit() or int(header_length) > len(raw):
            raise bad_input("bad Inference-Header-Content-Length")
        split = int(header_length)
        head, tail = raw[:split], raw[split:]
    else:
        head, tail = raw, b""
    try:
        body = json.loads(head)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise bad_input(f"infer request is not valid JSON: {exc}") from exc
    if not isinstance(body, dict) or not isinstance(body.get("inputs"), list) or not body["inputs"]:
        raise invalid("infer request needs a non-empty 'inputs' list", ["body", "inputs"])
    return body, tail


def pixels_tensor(body: dict[str, Any], tail: bytes, shape: tuple[int, int, int], modality: str) -> torch.Tensor:
    """``[N, C, H, W]`` float32 from the single ``pixels`` input."""
    offset = 0
    found = None
    for i, spec in enumerate(body["inputs"]):
        if not isinstance(spec, dict):
            raise invalid(f"inputs.{i} is not an object", ["body", "inputs", i])
        size = (spec.get("parameters") or {}).get("binary_data_size")
        chunk = None
        if size is not None:
            if not isinstance(size, int) or size < 0 or offset + size > len(tail):
                raise bad_input(f"inputs.{i}: binary_data_size exceeds the binary data")
            chunk, offset = tail[offset:offset + size], offset + size
        if spec.get("name") == "text":
            raise invalid(f"input 'text' sent to a {modality} model; it takes 'pixels' FP32 [-1, "
                          f"{', '.join(map(str, shape))}]", ["body", "inputs", i])
        if spec.get("name") == "pixels":
            found = (i, spec, chunk)
    if found is None:
        raise invalid("no input named 'pixels'", ["body", "inputs"])
    i, spec, chunk = found
    loc: list[str | int] = ["body", "inputs", i]
    datatype = spec.get("datatype")
    if datatype not in DTYPES:
        raise invalid(f"pixels datatype must be FP32 (or FP64/FP16/UINT8), got {datatype!r}", loc)
    dims = spec.get("shape")
    if not (isinstance(dims, list) and all(isinstance(d, int) and d >= 0 for d in dims)):
        raise invalid("pixels shape must be a list of non-negative integers", loc)
    if len(dims) != 4 or tuple(dims[1:]) != shape or dims[0] < 1:
        raise invalid(f"pixels shape {dims} must be [N, {', '.join(map(str, shape))}] with N >= 1", loc)
    count = math.prod(dims)
    dtype = DTYPES[datatype]
    if chunk is not None:
        if len(chunk) != count * np.dtype(dtype).itemsize:
            raise invalid(f"binary pixels hold {len(chunk)} bytes, shape {dims} needs "
                          f"{count * np.dtype(dtype).itemsize}", loc)
        array = np.frombuffer(chunk, dtype=dtype)
    else:
        try:
            array = np.asarray(spec.get("data"), dtype=dtype).reshape(-1)
        except (TypeError, ValueError) as exc:
            raise invalid("pixels data must be a (flat or nested) list of numbers", loc) from exc
        if array.size != count:
            raise invalid(f"pixels data holds {array.size} values, shape {dims} needs {count}", loc)
    array = array.astype(np.float32).reshape(dims)
    if datatype == "UINT8":
        array = array / 255.0
    check_values(array, loc)
    return torch.from_numpy(array.copy())


def int_parameter(parameters: dict[str, Any], name: str) -> int | None:
    value = parameters.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(f"parameter {name} must be an integer", ["body", "parameters", name])
    return value


def outputs_json(outcome: Outcome, requested: list[str] | None) -> list[dict[str, Any]]:
    s = outcome.summary
    assert outcome.entry.artifact is not None
    labels = outcome.entry.artifact.labels
    n = int(s.confidence.shape[0])
    tensors: dict[str, tuple[str, list[int], list[Any]]] = {
        "probabilities": ("FP32", [n, len(labels)], s.probabilities.reshape(-1).tolist()),
        "confidence": ("FP32", [n], s.confidence.tolist()),
        "predictive_entropy": ("FP32", [n], s.predictive_entropy.tolist()),
        "expected_entropy": ("FP32", [n], s.expected_entropy.tolist()),
        "mutual_information": ("FP32", [n], s.mutual_information.tolist()),
        "ood_score": ("FP32", [n], outcome.ood),
        "is_ood": ("BOOL", [n], outcome.is_ood),
        "label": ("BYTES", [n], [labels[c] for c in s.prediction.tolist()]),
        "class_index": ("INT64", [n], s.prediction.tolist()),
    }
    names = requested or list(OUTPUTS)
    unknown = [name for name in names if name not in tensors]
    if unknown:
        raise invalid(f"unknown outputs {unknown}; available: {list(OUTPUTS)}", ["body", "outputs"])
    return [{"name": name, "datatype": tensors[name][0], "shape": tensors[name][1], "data": tensors[name][2]}
            for name in names]


def metadata(name: str, versions: list[str], shape: tuple[int, int, int], num_classes: int) -> dict[str, Any]:
    return {
        "name": name, "versions": versions, "platform": "pytorch_torchscript",
        "inputs": [{"name": "pixels", "datatype": "FP32", "shape": [-1, *shape]}],
        "outputs": [{"name": "probabilities", "datatype": "FP32", "shape": [-1, num_classes]}]
        + [{"name": n, "datatype": "FP32", "shape": [-1]} for n in ("confidence", "predictive_entropy",
                                                                      "expected_entropy", "mutual_information",
                                                                      "ood_score")]
        + [{"name": "is_ood", "datatype": "BOOL", "shape": [-1]}, {"name": "label", "datatype": "BYTES", "shape": [-1]},
           {"name": "class_index", "datatype": "INT64", "shape": [-1]}],
    }
