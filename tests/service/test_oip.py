"""Open Inference Protocol v2 routes, driven by the real tritonclient[http] client."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from tests.service.conftest import Running

OUTPUTS = ("probabilities", "confidence", "predictive_entropy", "expected_entropy", "mutual_information",
           "ood_score", "is_ood", "label")


@pytest.fixture
def client(tiny_server: Running) -> triton.InferenceServerClient:
    return triton.InferenceServerClient(url=tiny_server.url.removeprefix("http://"), network_timeout=30.0)


def pixels_input(batch: int, binary: bool, seed: int = 0) -> triton.InferInput:
    data = np.random.default_rng(seed).random((batch, 1, 28, 28), dtype=np.float32)
    tensor = triton.InferInput("pixels", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data, binary_data=binary)
    return tensor


def test_health_and_metadata(client: triton.InferenceServerClient) -> None:
    assert client.is_server_live() and client.is_server_ready()
    server = client.get_server_metadata()
    assert server["name"] == "director-serving" and "binary_tensor_data" in server["extensions"]
    assert client.is_model_ready("tiny") and client.is_model_ready("tiny", "1")
    assert not client.is_model_ready("tiny", "7")
    meta = client.get_model_metadata("tiny")
    assert meta["versions"] == ["1"]
    assert meta["inputs"] == [{"name": "pixels", "datatype": "FP32", "shape": [-1, 1, 28, 28]}]
    datatypes = {o["name"]: o["datatype"] for o in meta["outputs"]}
    assert {name: datatypes[name] for name in OUTPUTS} == {
        "probabilities": "FP32", "confidence": "FP32", "predictive_entropy": "FP32", "expected_entropy": "FP32",
        "mutual_information": "FP32", "ood_score": "FP32", "is_ood": "BOOL", "label": "BYTES"}
    assert client.get_model_metadata("tiny", "1")["versions"] == ["1"]


@pytest.mark.parametrize("binary", [True, False])
def test_infer_returns_every_output(client: triton.InferenceServerClient, binary: bool) -> None:
    result = client.infer("tiny", [pixels_input(3, binary)], parameters={"n_samples": 4},
                          outputs=[triton.InferRequestedOutput(name, binary_data=False) for name in OUTPUTS])
    probabilities = result.as_numpy("probabilities")
    assert probabilities.shape == (3, 10) and np.allclose(probabilities.sum(1), 1.0, atol=1e-5)
    confidence = result.as_numpy("confidence")
    np.testing.assert_allclose(confidence, probabilities.max(1), rtol=1e-6)
    mi = result.as_numpy("mutual_information")
    np.testing.assert_allclose(mi, np.maximum(result.as_numpy("predictive_entropy")
                                              - result.as_numpy("expected_entropy"), 0), atol=1e-5)
    assert result.as_numpy("is_ood").dtype == np.bool_ and result.as_numpy("ood_score").shape == (3,)
    labels = result.as_numpy("label")
    assert labels.shape == (3,) and all(isinstance(label, str | bytes) for label in labels)
    response = result.get_response()
    assert response["model_name"] == "tiny" and response["model_version"] == "1"
    assert response["parameters"]["n_samples"] == 4


def test_seeded_infer_on_a_version_is_reproducible(client: triton.InferenceServerClient) -> None:
    def run() -> np.ndarray:
        return client.infer("tiny", [pixels_input(2, True, seed=3)], model_version="1",
                            parameters={"n_samples": 8, "seed": 42}).as_numpy("probabilities")

    np.testing.assert_array_equal(run(), run())


def test_infer_errors(client: triton.InferenceServerClient, tiny_server: Running) -> None:
    with pytest.raises(InferenceServerException, match="unknown model"):
        client.infer("nope", [pixels_input(1, True)])
    with pytest.raises(InferenceServerException, match="n_samples"):
        client.infer("tiny", [pixels_input(1, True)], parameters={"n_samples": 99})
    wrong = triton.InferInput("pixels", [1, 28, 28], "FP32")
    wrong.set_data_from_numpy(np.zeros((1, 28, 28), np.float32))
    with pytest.raises(InferenceServerException, match="shape"):
        client.infer("tiny", [wrong])
    text = triton.InferInput("text", [1], "BYTES")
    text.set_data_from_numpy(np.array([b"hello"], dtype=np.object_))
    with pytest.raises(InferenceServerException, match="text"):
        client.infer("tiny", [text])
    body = json.dumps({"inputs": [{"name": "pixels", "datatype": "FP32", "shape": [1, 1, 28, 28],
                                   "data": [0.5] * 783 + [float("nan")]}]})  # json.dumps writes NaN
    raw = httpx.post(f"{tiny_server.url}/v2/models/tiny/infer", content=body)
    assert raw.status_code == 422 and "NaN" in raw.json()["error"]
    short = httpx.post(f"{tiny_server.url}/v2/models/tiny/infer", json={"inputs": [
        {"name": "pixels", "datatype": "FP32", "shape": [1, 1, 28, 28], "data": [0.5] * 10}]})
    assert short.status_code == 422
    garbage = httpx.post(f"{tiny_server.url}/v2/models/tiny/infer", content=b"{nope")
    assert garbage.status_code == 400
