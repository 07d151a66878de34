"""The decision parameters (``coverage``, ``max_risk`` and the rest) as each entry point reads them: an integer of
hundreds of digits is a bad value (422 naming it, INVALID_ARGUMENT over gRPC), never a 500; ``/predict`` takes
JSON numbers only, as OIP does; and a request-wide parameter given in one OIP input's ``parameters`` is refused with
where to put it, never dropped."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc
from tritonclient.utils import InferenceServerException

from tests.service.conftest import Running, copy_version, random_pixels, serve, settings_for
from tests.service.test_grpc import free_port

PIXELS = random_pixels(np.random.default_rng(3), 1)[0]  # [1][28][28]
HUGE = 10**400  # a JSON integer of 401 digits


@pytest.fixture(scope="module")
def served(tiny_artifact: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Running, str]]:
    """The tiny model (with its conformal part) over HTTP and gRPC."""
    tmp = tmp_path_factory.mktemp("decision-parameters")
    copy_version(tiny_artifact, tmp / "repository", "tiny", "1")
    port = free_port()
    with serve(settings_for(tmp / "repository", tmp, grpc_port=port)) as running:
        yield running, f"127.0.0.1:{port}"


def oip(running: Running, parameters: dict[str, Any], input_parameters: dict[str, Any] | None = None
        ) -> httpx.Response:
    tensor: dict[str, Any] = {"name": "pixels", "datatype": "FP32", "shape": [1, 1, 28, 28], "data": PIXELS}
    if input_parameters is not None:
        tensor["parameters"] = input_parameters
    return httpx.post(f"{running.url}/v2/models/tiny/infer", json={"inputs": [tensor], "parameters": parameters},
                      timeout=60)


def predict(running: Running, **fields: Any) -> httpx.Response:
    return httpx.post(f"{running.url}/predict", json={"inputs": [{"pixels": PIXELS}], **fields}, timeout=60)


def assert_refused(response: httpx.Response, loc: list[Any], *words: str) -> None:
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["status"] == 422 and body["type"] == "invalid_input" and "Traceback" not in response.text
    assert [d["loc"] for d in body["details"]] == [loc], body
    for word in words:
        assert word in body["error"], body


def test_an_integer_of_hundreds_of_digits_is_a_bad_value_not_a_500(served: tuple[Running, str]) -> None:
    """It was an OverflowError (500) over OIP, where /predict answered 422."""
    running, address = served
    for name, value in (("coverage", HUGE), ("max_risk", -HUGE), ("coverage", 2**1100)):
        response = oip(running, {name: value})
        assert_refused(response, ["body", "parameters", name], f"parameter {name} must be between 0 and 1")
        assert len(response.json()["error"]) < 200, response.json()["error"]  # the digits are not echoed back
        assert predict(running, **{name: value}).status_code == 422
    assert oip(running, {"coverage": 0.9}).status_code == 200  # the same request with a fraction is answered
    client = triton_grpc.InferenceServerClient(address)  # gRPC's int64 shares the check
    tensor = triton_grpc.InferInput("pixels", [1, 1, 28, 28], "FP32")
    tensor.set_data_from_numpy(np.asarray([PIXELS], dtype=np.float32))
    with pytest.raises(InferenceServerException, match="INVALID_ARGUMENT") as refused:
        client.infer("tiny", [tensor], parameters={"coverage": 2**63 - 1})
    assert "parameter coverage must be between 0 and 1" in str(refused.value)


def test_predict_takes_numbers_only_for_its_decision_fields(served: tuple[Running, str]) -> None:
    """``"coverage": "0.9"`` was read as 0.9 where ``"n_samples": "1"`` and OIP's ``"0.9"`` are refused."""
    running, _ = served
    for name, value in (("coverage", "0.9"), ("max_risk", "0.2"), ("coverage", True), ("max_risk", "1e-1")):
        assert_refused(predict(running, **{name: value}), ["body", name])
    assert_refused(predict(running, n_samples="1"), ["body", "n_samples"])  # as it always was
    answered = predict(running, coverage=0.9, max_risk=0.2)
    assert answered.status_code == 200, answered.text
    assert answered.json()["decisions"]["coverage"] == 0.9 and "abstain" in answered.json()["predictions"][0]


def test_a_request_parameter_in_an_inputs_parameters_is_refused_with_where_it_goes(
        served: tuple[Running, str]) -> None:
    """``coverage`` given in an input's parameters was ignored: the answer came without the sets asked for."""
    running, address = served
    for name, value in (("coverage", 0.9), ("max_risk", 0.2), ("n_samples", 2), ("seed", 1),
                        ("conformal_score", "lac"), ("class_conditional", True), ("abstain_if_ood", False)):
        response = oip(running, {}, {name: value})
        assert_refused(response, ["body", "inputs", 0, "parameters", name], name, "request's parameters")
    assert oip(running, {"coverage": 0.9}, {"binary_data_size": None}).status_code == 200  # an input's own: kept
    request = pb.ModelInferRequest(model_name="tiny")
    tensor = request.inputs.add(name="pixels", datatype="FP32", shape=[1, 1, 28, 28])
    tensor.contents.fp32_contents.extend(np.asarray(PIXELS, dtype=np.float32).reshape(-1).tolist())
    tensor.parameters["coverage"].double_param = 0.9
    with grpc.insecure_channel(address) as channel, pytest.raises(grpc.RpcError) as refused:
        pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request)
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "coverage" in refused.value.details() and "request's parameters" in refused.value.details()
