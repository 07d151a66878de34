"""Open Inference Protocol v2 routes, driven by the real tritonclient[http] client."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from tests.service.conftest import QUIET_MODEL, TEXT_MODEL, Running

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


def test_binary_outputs_when_asked_equal_the_json_ones(client: triton.InferenceServerClient,
                                                      tiny_server: Running) -> None:
    """Per output (``binary_data``) or by default for all (tritonclient asks with ``binary_data_output`` when it
    names no outputs): the same seeded request gives the same tensors, whichever way each travels."""
    def run(outputs: list[triton.InferRequestedOutput] | None) -> triton.InferResult:
        return client.infer("tiny", [pixels_input(2, True, seed=5)], outputs=outputs,
                            parameters={"n_samples": 4, "seed": 7})

    as_json = run([triton.InferRequestedOutput(name, binary_data=False) for name in OUTPUTS])
    mixed = run([triton.InferRequestedOutput(name, binary_data=name in {"probabilities", "is_ood", "label"})
                 for name in OUTPUTS])
    default = run(None)
    for name in OUTPUTS:
        expected = as_json.as_numpy(name)
        for result in (mixed, default):
            got = result.as_numpy(name)
            assert got.shape == expected.shape and got.dtype.kind == expected.dtype.kind, name
            if name == "label":
                assert [str(v, "utf-8") if isinstance(v, bytes) else v for v in got] == list(expected), name
            else:
                np.testing.assert_array_equal(got, expected)
        assert ("data" in mixed.get_output(name)) is (name not in {"probabilities", "is_ood", "label"}), name
    assert mixed.get_output("probabilities")["parameters"]["binary_data_size"] == 2 * 10 * 4
    bad = httpx.post(f"{tiny_server.url}/v2/models/tiny/infer", json={
        "inputs": [{"name": "pixels", "datatype": "FP32", "shape": [1, 1, 28, 28], "data": [0.0] * 784}],
        "outputs": [{"name": "label", "parameters": {"binary_data": "yes"}}]})
    assert bad.status_code == 422 and "binary_data" in bad.json()["error"]


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


# ---- text models: `text` BYTES [-1] -------------------------------------------------------------------------------

TEXTS = ["a funny film.", "the acting is good but the story is not.", "so bad it is good, " * 8, "héllo wörld ✓ fine"]


@pytest.fixture
def text_client(text_server: Running) -> triton.InferenceServerClient:
    return triton.InferenceServerClient(url=text_server.url.removeprefix("http://"), network_timeout=30.0)


def text_input(texts: list[str], binary: bool) -> triton.InferInput:
    tensor = triton.InferInput("text", [len(texts)], "BYTES")
    tensor.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=np.object_), binary_data=binary)
    return tensor


def test_text_model_metadata(text_client: triton.InferenceServerClient) -> None:
    assert text_client.is_model_ready(TEXT_MODEL)
    meta = text_client.get_model_metadata(TEXT_MODEL)
    assert meta["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1, 1]}]  # Triton's batched form
    datatypes = {o["name"]: o["datatype"] for o in meta["outputs"]}
    assert datatypes["tokens"] == "INT64" and datatypes["truncated"] == "BOOL" and datatypes["label"] == "BYTES"
    assert meta["outputs"][0] == {"name": "probabilities", "datatype": "FP32", "shape": [-1, 2]}


@pytest.mark.parametrize("binary", [True, False])
def test_text_infer_with_bytes(text_client: triton.InferenceServerClient, text_server: Running, binary: bool) -> None:
    """BYTES in the binary layout and as JSON strings; on the noise-off model the answer equals /predict's."""
    result = text_client.infer(QUIET_MODEL, [text_input(TEXTS, binary)], parameters={"n_samples": 2})
    probabilities = result.as_numpy("probabilities")
    assert probabilities.shape == (4, 2) and np.allclose(probabilities.sum(1), 1.0, atol=1e-5)
    np.testing.assert_allclose(result.as_numpy("confidence"), probabilities.max(1), rtol=1e-6)
    assert result.as_numpy("truncated").tolist() == [False, False, True, False]
    tokens = result.as_numpy("tokens")
    assert tokens[2] == 32 and result.as_numpy("dropped_tokens")[2] > 0 and result.as_numpy("dropped_tokens")[0] == 0
    assert set(result.as_numpy("label").astype(str).tolist()) <= {"negative", "positive"}
    response = result.get_response()
    assert response["model_name"] == QUIET_MODEL and response["parameters"]["n_samples"] == 2
    http = httpx.post(f"{text_server.url}/predict", json={"model": QUIET_MODEL, "n_samples": 2,
                                                          "inputs": [{"text": t} for t in TEXTS]}, timeout=30).json()
    assert [p["tokens"] for p in http["predictions"]] == tokens.tolist()
    expected = np.array([[p["probabilities"]["negative"], p["probabilities"]["positive"]] for p in http["predictions"]])
    np.testing.assert_allclose(probabilities, expected, atol=1e-5)
    nested = httpx.post(f"{text_server.url}/v2/models/{TEXT_MODEL}/infer", json={"inputs": [
        {"name": "text", "datatype": "BYTES", "shape": [2, 1], "data": [["a funny film."], ["dull."]]}]}, timeout=30)
    assert nested.status_code == 200, nested.text
    assert {o["name"]: o["shape"] for o in nested.json()["outputs"]}["tokens"] == [2]


def test_text_infer_errors(text_client: triton.InferenceServerClient, text_server: Running) -> None:
    with pytest.raises(InferenceServerException, match="takes 'text' BYTES"):
        text_client.infer(TEXT_MODEL, [pixels_input(1, True)])
    with pytest.raises(InferenceServerException, match="201 characters"):
        text_client.infer(TEXT_MODEL, [text_input(["fine", "x" * 201], True)])
    with pytest.raises(InferenceServerException, match="empty"):
        text_client.infer(TEXT_MODEL, [text_input(["  "], False)])
    with pytest.raises(InferenceServerException, match="takes 'pixels'"):
        text_client.infer("tiny", [text_input(["a funny film."], True)])
    url = f"{text_server.url}/v2/models/{TEXT_MODEL}/infer"
    cases = [
        ({"inputs": [{"name": "text", "datatype": "FP32", "shape": [1], "data": [1.0]}]}, 422),
        ({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [2], "data": ["only one"]}]}, 422),
        ({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": [3]}]}, 422),
        ({"inputs": [{"name": "words", "datatype": "BYTES", "shape": [1], "data": ["x"]}]}, 422),
    ]
    for body, status in cases:
        response = httpx.post(url, json=body, timeout=30)
        assert response.status_code == status, (body, response.text)
        assert "Traceback" not in response.text
    head = json.dumps({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1],
                                   "parameters": {"binary_data_size": 6}}]}).encode()
    for tail in (b"\x02\x00\x00\x00\xff\xfe", b"\x09\x00\x00\x00ab"):  # not UTF-8; length beyond the data
        response = httpx.post(url, content=head + tail, timeout=30,
                              headers={"Inference-Header-Content-Length": str(len(head))})
        assert response.status_code == 400 and response.json()["type"] == "bad_request", response.text
