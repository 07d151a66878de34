"""The gRPC Open Inference Protocol (``service.api.grpc_service``) over a real server, read by the real clients:
tritonclient.grpc (metadata, Triton's config, statistics and repository calls, inference with raw and typed tensors)
and KServe's ``InferenceGRPCClient``; the same key, errors and metrics as HTTP."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc
from tritonclient.utils import InferenceServerException

from tests.service.conftest import TEXT_MODEL, Running, metric_value, serve, settings_for

KEY = "grpc-test-key"
AUTH = {"authorization": f"Bearer {KEY}"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def grpc_server(text_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Running, str]]:
    tmp = tmp_path_factory.mktemp("grpc-server")
    port = free_port()
    settings = settings_for(text_repository, tmp, grpc_port=port, api_key=KEY, max_inputs_per_request=8)
    with serve(settings) as running:
        yield running, f"127.0.0.1:{port}"


@pytest.fixture
def client(grpc_server: tuple[Running, str]) -> triton.InferenceServerClient:
    return triton.InferenceServerClient(grpc_server[1])


def pixels(batch: int) -> np.ndarray:
    return np.random.default_rng(0).random((batch, 1, 28, 28), dtype=np.float32)  # [N, 1, 28, 28]


def test_health_is_open_and_everything_else_needs_the_key(client: triton.InferenceServerClient) -> None:
    assert client.is_server_live() and client.is_server_ready()
    with pytest.raises(InferenceServerException, match="UNAUTHENTICATED"):
        client.get_model_metadata("tiny")
    with pytest.raises(InferenceServerException, match="UNAUTHENTICATED"):
        client.is_model_ready("tiny", headers={"authorization": "Bearer wrong"})
    assert client.is_model_ready("tiny", headers=AUTH)
    metadata = client.get_server_metadata(headers=AUTH)
    assert metadata.name == "director-serving" and "model_repository" in metadata.extensions


def test_metadata_and_config_match_http(client: triton.InferenceServerClient, grpc_server: tuple[Running, str]
                                        ) -> None:
    running = grpc_server[0]
    headers = {"Authorization": f"Bearer {KEY}"}
    for model in ("tiny", TEXT_MODEL):
        over_http = httpx.get(f"{running.url}/v2/models/{model}", headers=headers).json()
        metadata = client.get_model_metadata(model, headers=AUTH, as_json=True)
        assert [(i["name"], i["datatype"], [int(d) for d in i["shape"]]) for i in metadata["inputs"]] == [
            (i["name"], i["datatype"], i["shape"]) for i in over_http["inputs"]]
        assert [o["name"] for o in metadata["outputs"]] == [o["name"] for o in over_http["outputs"]]
        config = client.get_model_config(model, headers=AUTH, as_json=True)["config"]
        config_http = httpx.get(f"{running.url}/v2/models/{model}/config", headers=headers).json()
        assert config["name"] == model and int(config["max_batch_size"]) == config_http["max_batch_size"] == 8
        assert [i["name"] for i in config["input"]] == [i["name"] for i in config_http["input"]]
        assert config["parameters"].keys() == config_http["parameters"].keys()


def test_image_inference_with_raw_tensors(client: triton.InferenceServerClient) -> None:
    tensor = triton.InferInput("pixels", [3, 1, 28, 28], "FP32")
    tensor.set_data_from_numpy(pixels(3))
    wanted = [triton.InferRequestedOutput(name) for name in ("label", "confidence", "is_ood", "probabilities")]
    result = client.infer("tiny", [tensor], outputs=wanted, request_id="req-1", parameters={"n_samples": 4},
                          headers=AUTH)
    response = result.get_response()
    assert response.id == "req-1" and response.model_name == "tiny" and response.model_version == "1"
    assert response.parameters["n_samples"].int64_param == 4
    assert [output.name for output in response.outputs] == ["label", "confidence", "is_ood", "probabilities"]
    probabilities = result.as_numpy("probabilities")
    assert probabilities.shape[0] == 3 and np.allclose(probabilities.sum(1), 1.0, atol=1e-4)
    assert np.allclose(result.as_numpy("confidence"), probabilities.max(1), atol=1e-6)
    assert result.as_numpy("label").shape == (3,) and result.as_numpy("is_ood").dtype == np.bool_


def test_typed_contents_give_the_raw_tensors_answer(grpc_server: tuple[Running, str]) -> None:
    """The same pixels as typed ``fp32_contents`` and as ``raw_input_contents``, under one seed: the same answer."""
    data = pixels(2)
    with grpc.insecure_channel(grpc_server[1]) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        answers = []
        for typed in (True, False):
            request = pb.ModelInferRequest(model_name="tiny")
            request.parameters["seed"].int64_param = 7
            tensor = request.inputs.add(name="pixels", datatype="FP32", shape=[2, 1, 28, 28])
            if typed:
                tensor.contents.fp32_contents.extend(data.reshape(-1).tolist())
            else:
                request.raw_input_contents.append(data.tobytes())
            response = stub.ModelInfer(request, metadata=tuple(AUTH.items()))
            index = [o.name for o in response.outputs].index("probabilities")
            answers.append(np.frombuffer(response.raw_output_contents[index], dtype="<f4"))
    assert np.array_equal(answers[0], answers[1])


def test_text_inference_reports_tokens(client: triton.InferenceServerClient) -> None:
    texts = triton.InferInput("text", [2, 1], "BYTES")
    texts.set_data_from_numpy(np.array([[b"a warm and funny film."], [b"dull."]], dtype=object))
    result = client.infer(TEXT_MODEL, [texts], headers=AUTH)
    assert result.as_numpy("label").shape == (2,)
    assert (result.as_numpy("tokens") > 0).all() and not result.as_numpy("truncated").any()


def test_errors_are_grpc_codes_with_the_http_message(client: triton.InferenceServerClient) -> None:
    tensor = triton.InferInput("pixels", [1, 1, 28, 28], "FP32")
    tensor.set_data_from_numpy(pixels(1))
    cases = [("nope", [tensor], {}, "NOT_FOUND", "unknown model 'nope'"),
             ("tiny", [tensor], {"n_samples": 0}, "INVALID_ARGUMENT", "n_samples must be between 1"),
             (TEXT_MODEL, [tensor], {}, "INVALID_ARGUMENT", "takes 'text' BYTES [-1, 1]")]
    for model, inputs, parameters, code, message in cases:
        with pytest.raises(InferenceServerException) as error:
            client.infer(model, inputs, parameters=parameters, headers=AUTH)
        assert code in str(error.value) and message in str(error.value), str(error.value)
    many = triton.InferInput("pixels", [9, 1, 28, 28], "FP32")  # the request limit is 8 inputs
    many.set_data_from_numpy(pixels(9))
    with pytest.raises(InferenceServerException, match="RESOURCE_EXHAUSTED"):
        client.infer("tiny", [many], headers=AUTH)


def test_statistics_and_metrics_count_grpc_calls(client: triton.InferenceServerClient,
                                                 grpc_server: tuple[Running, str]) -> None:
    before = client.get_inference_statistics("tiny", "1", headers=AUTH).model_stats[0].inference_stats.success.count
    tensor = triton.InferInput("pixels", [1, 1, 28, 28], "FP32")
    tensor.set_data_from_numpy(pixels(1))
    client.infer("tiny", [tensor], headers=AUTH)
    after = client.get_inference_statistics("tiny", "1", headers=AUTH).model_stats[0].inference_stats.success.count
    assert after == before + 1
    text = httpx.get(f"{grpc_server[0].url}/metrics").text
    endpoint = "/inference.GRPCInferenceService/ModelInfer"
    assert (metric_value(text, "director_requests_total", endpoint=endpoint, code="200") or 0) >= 1
    assert metric_value(text, "director_requests_total", endpoint="/inference.GRPCInferenceService/ServerLive",
                        code="200") is not None


def test_repository_index_unload_and_load(client: triton.InferenceServerClient) -> None:
    index = client.get_model_repository_index(headers=AUTH)
    assert ("tiny", "1", "READY") in {(m.name, m.version, m.state) for m in index.models}
    client.unload_model("tiny", headers=AUTH)
    assert ("tiny", "", "UNAVAILABLE") in {(m.name, m.version, m.state)
                                          for m in client.get_model_repository_index(headers=AUTH).models}
    with pytest.raises(InferenceServerException, match="NOT_FOUND"):
        client.get_model_metadata("tiny", headers=AUTH)
    client.load_model("tiny", headers=AUTH)
    assert client.is_model_ready("tiny", headers=AUTH)
    with pytest.raises(InferenceServerException, match="NOT_FOUND"):
        client.load_model("no-such-folder", headers=AUTH)


KSERVE_CLIENT = """
import asyncio, json, sys
import numpy as np
from kserve import InferenceGRPCClient, InferInput, InferRequest

async def ask(address, key):
    client = InferenceGRPCClient(address)
    headers = (("authorization", "Bearer " + key),)
    try:
        tensor = InferInput("pixels", [2, 1, 28, 28], "FP32")
        tensor.set_data_from_numpy(np.random.default_rng(0).random((2, 1, 28, 28), dtype=np.float32))
        request = InferRequest(model_name="tiny", infer_inputs=[tensor], request_id="kserve-1",
                               parameters={"n_samples": 2})
        response = await client.infer(request, headers=headers)
        labels = next(output for output in response.outputs if output.name == "label").as_numpy()
        ready = await client.is_model_ready("tiny", headers=headers)
        return {"id": response.id, "labels": [str(label) for label in labels.tolist()], "ready": ready}
    finally:
        await client.close()

print(json.dumps(asyncio.run(ask(sys.argv[1], sys.argv[2]))))
"""


def test_kserve_grpc_client_infers(grpc_server: tuple[Running, str]) -> None:
    """KServe's client in a process of its own: its generated messages and Triton's (which the server uses) define
    the same protobuf package, and one process's descriptor pool holds only one of them."""
    done = subprocess.run([sys.executable, "-c", KSERVE_CLIENT, grpc_server[1], KEY], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer["id"] == "kserve-1" and len(answer["labels"]) == 2 and answer["ready"] is True
