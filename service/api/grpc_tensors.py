"""The gRPC Open Inference Protocol's messages <-> the protocol's JSON form (``service.api.oip``): a
``ModelInferRequest`` becomes the JSON header and binary tail the HTTP binary extension carries (typed ``contents``
are written as the raw bytes ``raw_input_contents`` would hold), and an inference answer becomes a
``ModelInferResponse`` whose outputs travel in ``raw_output_contents``, as Triton's server sends them."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
from tritonclient.grpc import service_pb2 as pb

from service.api.oip_binary import tensor_bytes
from service.errors import invalid, too_large

# the typed ``contents`` field of each datatype, and how its values are laid out as raw bytes (little-endian)
CONTENTS = {"FP32": ("fp32_contents", "<f4"), "FP64": ("fp64_contents", "<f8"), "UINT8": ("uint_contents", "|u1"),
            "INT64": ("int64_contents", "<i8"), "BOOL": ("bool_contents", "|u1")}


def parameters_of(parameters: Any) -> dict[str, Any]:
    """A protobuf map of ``InferParameter`` as plain values (int64 and uint64 as int, bool, double, string)."""
    out = {}
    for name, parameter in parameters.items():
        choice = parameter.WhichOneof("parameter_choice")
        out[name] = None if choice is None else getattr(parameter, choice)
    return out


def contents_bytes(tensor: Any, index: int) -> bytes:
    """A tensor sent in typed ``contents`` as the bytes ``raw_input_contents`` would hold."""
    loc: list[str | int] = ["body", "inputs", index]
    if tensor.datatype == "BYTES":
        return b"".join(struct.pack("<I", len(item)) + item for item in tensor.contents.bytes_contents)
    if tensor.datatype not in CONTENTS:
        raise invalid(f"inputs.{index}: datatype {tensor.datatype!r} cannot be sent in contents; send "
                      "raw_input_contents", loc)
    field, layout = CONTENTS[tensor.datatype]
    try:
        return np.asarray(getattr(tensor.contents, field), dtype=layout).tobytes()
    except OverflowError as exc:  # a UINT8 value sent in the 32 bits of uint_contents
        raise invalid(f"inputs.{index}: {tensor.datatype} contents hold a value out of range ({exc})", loc) from exc


def request_body(request: Any, limit: int) -> tuple[dict[str, Any], bytes]:
    """A ``ModelInferRequest`` as the JSON header and binary tail of an HTTP infer request. A tensor whose shape
    declares more than ``limit`` inputs is refused (413) before any typed ``contents`` are converted."""
    for tensor in request.inputs:
        if tensor.shape and tensor.shape[0] > limit:
            raise too_large(f"{tensor.shape[0]} inputs in one request, the limit is {limit}")
    raw = list(request.raw_input_contents)
    if raw and len(raw) != len(request.inputs):
        raise invalid(f"raw_input_contents holds {len(raw)} tensors for {len(request.inputs)} inputs",
                      ["body", "inputs"])
    inputs, chunks = [], []
    for i, tensor in enumerate(request.inputs):
        if raw and tensor.HasField("contents"):  # one of the two would be dropped without a word
            raise invalid(f"inputs.{i}: sent both in typed contents and in raw_input_contents; send one of them",
                          ["body", "inputs", i])
        data = raw[i] if raw else contents_bytes(tensor, i)
        own = parameters_of(tensor.parameters)  # checked as HTTP's are: a request's parameter there is refused
        inputs.append({"name": tensor.name, "datatype": tensor.datatype, "shape": list(tensor.shape),
                       "parameters": {**own, "binary_data_size": len(data)}})
        chunks.append(data)
    body: dict[str, Any] = {"inputs": inputs, "parameters": parameters_of(request.parameters)}
    if not inputs:
        raise invalid("infer request needs a non-empty 'inputs' list", ["body", "inputs"])
    if request.id:
        body["id"] = request.id
    if request.outputs:
        body["outputs"] = [{"name": output.name} for output in request.outputs]
    return body, b"".join(chunks)


def set_parameter(parameter: Any, value: Any) -> None:
    if isinstance(value, bool):
        parameter.bool_param = value
    elif isinstance(value, int):
        parameter.int64_param = value
    elif isinstance(value, float):
        parameter.double_param = value
    else:
        parameter.string_param = str(value)


def infer_response(response: dict[str, Any]) -> Any:
    """The JSON form of an inference answer (``Inference.response``) as a ``ModelInferResponse``."""
    message = pb.ModelInferResponse(model_name=response["model_name"], model_version=response["model_version"],
                                    id=response.get("id", ""))
    for name, value in response["parameters"].items():
        set_parameter(message.parameters[name], value)
    for output in response["outputs"]:
        message.outputs.add(name=output["name"], datatype=output["datatype"], shape=output["shape"])
        message.raw_output_contents.append(tensor_bytes(output["datatype"], output["data"]))
    return message
