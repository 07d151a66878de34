"""Open Inference Protocol v2 (KServe / Triton HTTP) tensors <-> the server's requests and results.

Inputs: the model decoder's one tensor (``service.engine.modalities``): ``pixels`` FP32 ``[-1, C, H, W]`` for image
models (FP64, FP16 and UINT8 accepted), ``text`` BYTES ``[-1, 1]`` for text models (UTF-8, one string per input as
Triton batches them; ``[N]`` accepted too); JSON data (flat or nested) or the binary tensor extension
(``Inference-Header-Content-Length``; BYTES elements as 4-byte little-endian length + bytes). Parameters:
``n_samples`` and ``seed``, the request's (in an input's ``parameters``, refused: ``request_wide``). Outputs (JSON):
``probabilities`` FP32 ``[N, K]``, ``confidence``, ``predictive_entropy``, ``expected_entropy``,
``mutual_information``, ``ood_score`` FP32 ``[N]``, ``is_ood`` BOOL ``[N]``, ``label`` BYTES ``[N]``, ``class_index``
INT64 ``[N]``, the decoder's per-input extras (text models: ``tokens`` INT64, ``truncated`` BOOL and
``dropped_tokens`` INT64 ``[N]``) and, when the request's parameters ask for them, the prediction sets and
abstentions (``service.api.oip_decisions``)."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from service.api import oip_decisions
from service.api.json_body import parse_json
from service.api.protocol import SEED_MAX
from service.engine.artifact import Artifact
from service.engine.decisions import DecisionRequest
from service.engine.images import check_values, float_array
from service.engine.modalities.base import InputDecoder, PixelValues, RawInput, TensorSpec, Text
from service.engine.predictor import Outcome
from service.engine.tasks import ServedTask
from service.engine.texts import surrogate_message
from service.errors import bad_input, invalid, shown, too_large

HEADER_LENGTH = "inference-header-content-length"
MAX_REQUEST_ID = 128  # as X-Request-ID (service.api.request_context)
DTYPES = {"FP32": np.float32, "FP64": np.float64, "FP16": np.float16, "UINT8": np.uint8}
# the outputs every model answers with, and their OIP datatypes: probabilities [N, K], each other one value per input
OUTPUT_TYPES = {"probabilities": "FP32", "confidence": "FP32", "predictive_entropy": "FP32", "expected_entropy": "FP32",
                "mutual_information": "FP32", "ood_score": "FP32", "is_ood": "BOOL", "label": "BYTES",
                "class_index": "INT64"}
OUTPUTS = tuple(OUTPUT_TYPES)
REQUEST_PARAMETERS = ("n_samples", "seed", *oip_decisions.ASKS)  # the request's, never an input's
SINGLE = ServedTask()  # a single-label model: no per-label outputs


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
        body = parse_json(head)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise bad_input(f"infer request is not valid JSON: {exc}") from exc
    except RecursionError as exc:  # Python's parser recurses once per level of nesting
        raise bad_input("infer request is not valid JSON: nested too deeply") from exc
    if not isinstance(body, dict) or not isinstance(body.get("inputs"), list) or not body["inputs"]:
        raise invalid("infer request needs a non-empty 'inputs' list", ["body", "inputs"])
    return body, tail


Found = tuple[int, dict[str, Any], bytes | None]  # input index, its spec, its binary chunk (if binary)


def named_inputs(body: dict[str, Any], tail: bytes) -> dict[str, Found]:
    """Every input by name, with its slice of the binary tail (inputs sent as binary take their
    ``binary_data_size`` bytes of it in order)."""
    offset = 0
    found: dict[str, Found] = {}
    for i, spec in enumerate(body["inputs"]):
        if not isinstance(spec, dict):
            raise invalid(f"inputs.{i} is not an object", ["body", "inputs", i])
        parameters = parameters_of(spec, ["body", "inputs", i, "parameters"])
        request_wide(parameters, i)
        size = parameters.get("binary_data_size")
        chunk = None
        if size is not None:
            if not _is_int(size) or size < 0 or offset + size > len(tail):
                raise bad_input(f"inputs.{i}: binary_data_size exceeds the binary data")
            chunk, offset = tail[offset:offset + size], offset + size
        name = spec.get("name")
        if isinstance(name, str):
            if name in found:
                raise invalid(f"inputs.{i}: input name {shown(name)} is given twice; each input is named once",
                              ["body", "inputs", i, "name"])
            found[name] = (i, spec, chunk)
    return found


def spec_text(spec: TensorSpec) -> str:
    """How the protocol names a tensor in errors: ``'pixels' FP32 [-1, 1, 28, 28]``."""
    return f"{spec.name!r} {spec.datatype} [{', '.join(map(str, (-1, *spec.dims)))}]"


def raw_inputs(body: dict[str, Any], tail: bytes, decoder: InputDecoder, limit: int) -> list[RawInput]:
    """The model's input tensor (the decoder's ``tensor``) as raw inputs: a numeric tensor as one batch of pixel
    values, a BYTES tensor as one text per element; more than ``limit`` inputs (by the declared shape) are refused
    before any of the data is converted. CPU-bound: runs in the decode pool."""
    spec = decoder.tensor
    inputs = named_inputs(body, tail)
    if spec.name not in inputs:
        others = sorted(inputs)
        if others:
            raise invalid(f"input {shown(others[0])} is not an input of this {decoder.modality} model; it takes "
                          f"{spec_text(spec)}", ["body", "inputs", inputs[others[0]][0]])
        raise invalid(f"no input named {spec.name!r} ({spec_text(spec)})", ["body", "inputs"])
    i, item, chunk = inputs[spec.name]
    loc: list[str | int] = ["body", "inputs", i]
    datatype = item.get("datatype")
    if datatype not in (spec.datatype, *spec.accepted):
        also = f" (or {'/'.join(spec.accepted)})" if spec.accepted else ""
        raise invalid(f"{spec.name} datatype must be {spec.datatype}{also}, got {datatype!r}", loc)
    dims = tensor_dims(item, spec, loc)
    if dims[0] > limit:
        raise too_large(f"{dims[0]} inputs in one request, the limit is {limit}")
    if datatype == "BYTES":
        return [Text(text, [*loc, "data", j]) for j, text in enumerate(byte_strings(item, chunk, dims, i, loc))]
    return [PixelValues(numeric_array(item, chunk, dims, datatype, spec.name, loc), loc, batched=True)]


def tensor_dims(item: dict[str, Any], spec: TensorSpec, loc: list[str | int]) -> list[int]:
    """The tensor's shape: ``[N, *spec.dims]`` with N >= 1 (a one-element input may leave its dimension out)."""
    dims = item.get("shape")
    if not (isinstance(dims, list) and all(_is_int(d) and d >= 0 for d in dims)):
        raise invalid(f"{spec.name} shape must be a list of non-negative integers", loc)
    scalar = spec.dims == (1,) and len(dims) == 1
    if not dims or dims[0] < 1 or (tuple(dims[1:]) != spec.dims and not scalar):
        raise invalid(f"{spec.name} shape {dims} must be [N, {', '.join(map(str, spec.dims))}] with N >= 1", loc)
    return dims


def numeric_array(item: dict[str, Any], chunk: bytes | None, dims: list[int], datatype: str, name: str,
                  loc: list[str | int]) -> np.ndarray:
    """A numeric tensor as float32 in its shape, UINT8 scaled to [0, 1], checked finite and in range."""
    count = math.prod(dims)
    dtype = DTYPES[datatype]
    if chunk is not None:
        if len(chunk) != count * np.dtype(dtype).itemsize:
            raise invalid(f"binary {name} hold {len(chunk)} bytes, shape {dims} needs "
                          f"{count * np.dtype(dtype).itemsize}", loc)
        array = np.frombuffer(chunk, dtype=dtype)
    else:
        array = float_array(item.get("data"), loc, f"{name} data must be a (flat or nested) list of numbers")
        array = array.reshape(-1)
        if array.size != count:
            raise invalid(f"{name} data holds {array.size} values, shape {dims} needs {count}", loc)
        if datatype == "UINT8":
            check_uint8(array, loc)
    if datatype == "UINT8":
        array = array / 255.0
    check_values(array, loc)  # in the precision sent: a value no float32 holds is out of range, not rounded to inf
    return array.astype(np.float32).reshape(dims)


def check_uint8(array: np.ndarray, loc: list[str | int]) -> None:
    """UINT8 data sent as JSON numbers: whole numbers in 0..255, nothing wrapped around or rounded."""
    if array.size and not (np.isfinite(array).all() and (array == np.round(array)).all()
                           and array.min() >= 0 and array.max() <= 255):
        raise invalid("UINT8 pixels must be whole numbers in 0..255", loc)


def byte_strings(item: dict[str, Any], chunk: bytes | None, dims: list[int], index: int, loc: list[str | int]
                 ) -> list[str]:
    """The UTF-8 strings of a BYTES tensor."""
    count = dims[0]
    if chunk is not None:
        elements: list[Any] = _bytes_elements(chunk, loc)
    else:
        data = item.get("data")
        if isinstance(data, list) and all(isinstance(row, list) for row in data):
            data = [value for row in data for value in row]  # nested [[...], ...]
        if not isinstance(data, list) or not all(isinstance(value, str) for value in data):
            raise invalid("text data must be a (flat or nested) list of strings", loc)
        elements = data
    if len(elements) != count:
        raise invalid(f"text data holds {len(elements)} strings, shape {dims} needs {count}", loc)
    if chunk is None:
        return [str(e) for e in elements]
    try:
        return [bytes(e).decode("utf-8") for e in elements]
    except UnicodeDecodeError as exc:
        raise bad_input(f"inputs.{index}: text is not valid UTF-8 ({exc.reason} at byte {exc.start})") from exc


def _bytes_elements(chunk: bytes, loc: list[str | int]) -> list[bytes]:
    """The binary BYTES tensor layout: each element a 4-byte little-endian length, then that many bytes."""
    out, offset = [], 0
    while offset < len(chunk):
        if offset + 4 > len(chunk):
            raise bad_input(f"{'.'.join(map(str, loc[1:]))}: binary text ends inside an element's length prefix")
        size = int.from_bytes(chunk[offset:offset + 4], "little")
        offset += 4
        if offset + size > len(chunk):
            raise bad_input(f"{'.'.join(map(str, loc[1:]))}: binary text element longer than the data left")
        out.append(chunk[offset:offset + size])
        offset += size
    return out


def parameters_of(holder: dict[str, Any], loc: list[str | int]) -> dict[str, Any]:
    """The ``parameters`` object of the request or of one input (absent or null: none)."""
    value = holder.get("parameters")
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise invalid(f"{'.'.join(map(str, loc[1:]))} must be an object, got {type(value).__name__}", loc)
    return value


def request_wide(parameters: dict[str, Any], index: int) -> None:
    """Refuse a request's parameter given in one input's ``parameters`` (422 saying where it goes). The sample count,
    seed and decision asks are the request's: they apply to every input the tensor holds, and the request's own
    would contradict a tensor's; read nowhere, they would be dropped without a word."""
    for name in REQUEST_PARAMETERS:
        if name in parameters:
            raise invalid(f"parameter {name} applies to the whole request: give it in the request's parameters, not "
                          f"in those of inputs.{index}", ["body", "inputs", index, "parameters", name])


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def int_parameter(parameters: dict[str, Any], name: str) -> int | None:
    value = parameters.get(name)
    if value is None:
        return None
    if not _is_int(value):
        raise invalid(f"parameter {name} must be an integer", ["body", "parameters", name])
    return value


def seed_parameter(parameters: dict[str, Any]) -> int | None:
    """``seed`` in 0..2**63 - 1, the range ``torch.manual_seed`` takes (and /predict's)."""
    seed = int_parameter(parameters, "seed")
    if seed is not None and not 0 <= seed <= SEED_MAX:
        raise invalid(f"parameter seed must be between 0 and {SEED_MAX}", ["body", "parameters", "seed"])
    return seed


def request_id(body: dict[str, Any]) -> str | None:
    """The request's ``id`` (a string of at most ``MAX_REQUEST_ID`` characters, as ``X-Request-ID``: it is echoed,
    and logged with every input of the request), or None when there is none."""
    if "id" not in body:
        return None
    value = body["id"]
    if not isinstance(value, str):
        raise invalid(f"id must be a string, got {type(value).__name__}", ["body", "id"])
    if len(value) > MAX_REQUEST_ID:
        raise invalid(f"id must be at most {MAX_REQUEST_ID} characters, got {len(value)}", ["body", "id"])
    surrogate = surrogate_message(value)
    if surrogate is not None:
        raise invalid(f"id {surrogate}", ["body", "id"])
    return value


def available_outputs(decoder: InputDecoder, ask: DecisionRequest | None = None, task: ServedTask = SINGLE
                      ) -> list[str]:
    """The outputs a response carries when the request names none: every model's, the decoder's, the task's per-label
    ones (a multi-label model's) and those its decision asks give."""
    return [*OUTPUTS, *(spec.name for spec in decoder.extra_outputs), *task.label_outputs,
            *oip_decisions.answered_outputs(ask)]


def requested_outputs(body: dict[str, Any], decoder: InputDecoder, ask: DecisionRequest | None = None,
                      task: ServedTask = SINGLE) -> list[str] | None:
    """The output names the request asks for and will get, checked before inference (None or an empty list: every
    output): an unknown name is 422; a decision output without its ask is left out, or 400 when nothing is left
    (``oip_decisions.answerable``)."""
    outputs = body.get("outputs")
    if outputs is None:
        return None
    loc: list[str | int] = ["body", "outputs"]
    if not isinstance(outputs, list):
        raise invalid(f"outputs must be a list of {{\"name\": ...}} objects, got {type(outputs).__name__}", loc)
    names = []
    for i, item in enumerate(outputs):
        name = item.get("name") if isinstance(item, dict) else None
        if not isinstance(name, str):
            raise invalid(f"outputs.{i} must be an object with a string name", [*loc, i])
        names.append(name)
    available = [*OUTPUTS, *(spec.name for spec in decoder.extra_outputs), *task.label_outputs,
                 *oip_decisions.OUTPUT_TYPES]
    unknown = [name for name in names if name not in available]
    if unknown:
        raise invalid(f"unknown outputs {unknown}; available: {available}", loc)
    return oip_decisions.answerable(names, ask) or None


def outputs_json(outcome: Outcome, requested: list[str] | None) -> list[dict[str, Any]]:
    """The requested outputs (already checked by ``requested_outputs``) of a finished request."""
    s = outcome.summary
    decoder = outcome.entry.artifact.decoder
    labels = outcome.entry.artifact.labels
    n = int(s.confidence.shape[0])
    values: dict[str, tuple[list[int], list[Any]]] = {
        "probabilities": ([n, len(labels)], s.probabilities.reshape(-1).tolist()),
        "confidence": ([n], s.confidence.tolist()),
        "predictive_entropy": ([n], s.predictive_entropy.tolist()),
        "expected_entropy": ([n], s.expected_entropy.tolist()),
        "mutual_information": ([n], s.mutual_information.tolist()),
        "ood_score": ([n], outcome.ood),
        "is_ood": ([n], outcome.is_ood),
        "label": ([n], [labels[c] for c in s.prediction.tolist()]),
        "class_index": ([n], s.prediction.tolist()),
    }
    types = dict(OUTPUT_TYPES)
    for spec in decoder.extra_outputs:
        values[spec.name] = ([n], outcome.extras[spec.name])
        types[spec.name] = spec.datatype
    task = outcome.entry.artifact.task
    for name, rows in task.label_values(s).items():  # a multi-label model's per-label outputs [n, C]
        values[name], types[name] = ([n, len(labels)], [v for row in rows for v in row]), task.label_outputs[name]
    for name, (datatype, shape, data) in oip_decisions.output_values(outcome.decisions, labels).items():
        values[name], types[name] = (shape, data), datatype
    names = requested or [*available_outputs(decoder, task=task),
                          *(name for name in oip_decisions.OUTPUT_TYPES if name in values)]
    return [{"name": name, "datatype": types[name], "shape": values[name][0], "data": values[name][1]}
            for name in names]


def metadata(name: str, versions: list[str], artifact: Artifact) -> dict[str, Any]:
    """OIP model metadata: the input tensor, every output with its shape (the batch dimension -1), the decision
    outputs last when the version has decisions (a conformal part, or a multi-label version's label sets)."""
    decoder = artifact.decoder
    inputs = [{"name": decoder.tensor.name, "datatype": decoder.tensor.datatype, "shape": [-1, *decoder.tensor.dims]}]
    per_input = {name: kind for name, kind in OUTPUT_TYPES.items() if name != "probabilities"}
    per_input |= {spec.name: spec.datatype for spec in decoder.extra_outputs}
    per_label = {"probabilities": OUTPUT_TYPES["probabilities"], **artifact.task.label_outputs}
    width = len(artifact.labels)
    outputs = ([{"name": output, "datatype": kind, "shape": [-1, width]} for output, kind in per_label.items()]
               + [{"name": output, "datatype": kind, "shape": [-1]} for output, kind in per_input.items()]
               + oip_decisions.metadata_outputs(artifact))  # only with decisions; each says its ask
    return {"name": name, "versions": versions, "platform": "pytorch_torchscript", "inputs": inputs,
            "outputs": outputs}
