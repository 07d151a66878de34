"""Prediction sets and abstentions over the other entry points (docs/api.md, "Prediction sets and abstentions"): the
Open Inference Protocol over HTTP (the real tritonclient[http], JSON and binary outputs), over gRPC (the real
tritonclient.grpc) and the offline batch scorer answer ``coverage`` / ``max_risk`` as ``/predict`` does for the same
inputs and seed; a version without a conformal calibration is refused (400, INVALID_ARGUMENT over gRPC), a bad ask
422 / INVALID_ARGUMENT. A calibrated version declares the three outputs in its model metadata and Triton configuration
(HTTP and gRPC) as they are returned, marked as produced only when asked, and one without declares none; a request
naming every declared output without the asks (perf_analyzer's) is answered without them. Also: an OIP request with
more inputs than allowed is refused from its declared shape, before its tensor is converted."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc
from tritonclient.utils import InferenceServerException

from artifact.conformal import CONFORMAL_FILE
from artifact.contract import MANIFEST
from service.api import grpc_tensors, oip
from service.batch_scoring import main as score_main
from tests.service.conftest import Running, copy_version, random_pixels, rehash, serve, settings_for
from tests.service.test_decisions import without_conformal
from tests.service.test_grpc import free_port

LIMIT = 8  # inputs per request
PIXELS = random_pixels(np.random.default_rng(1), 6)  # [6][1][28][28], 4 decimals: exact in float32
SEEDED = {"n_samples": 4, "seed": 7}
ASK = {"coverage": 0.9, "conformal_score": "lac", "max_risk": 0.42, "abstain_if_ood": False, "widen_if_shifted": False}
DECISION_OUTPUTS = ("prediction_set", "set_size", "abstain", "exchangeable")
OWN_PARAMETERS = {"n_samples", "prediction_id", "ood_score_name", "ood_threshold"}


@dataclass
class Served:
    running: Running
    grpc_address: str
    repository: Path


def with_thresholds(source: Path, target: Path, thresholds: dict[str, float]) -> Path:
    """A copy of ``source`` whose selective thresholds at some risk levels are set (the tiny model meets none of
    its levels, so every input would abstain whatever the protocol), re-hashed."""
    shutil.copytree(source, target)
    document = json.loads((target / CONFORMAL_FILE).read_text())
    document["selective"]["thresholds"].update(thresholds)
    (target / CONFORMAL_FILE).write_text(json.dumps(document))
    rehash(target, json.loads((target / MANIFEST).read_text()))
    return target


@pytest.fixture(scope="module")
def served(tiny_artifact: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """``tiny`` (the tiny export, answering every input at risk 0.42 and none at 0.2) and ``plain`` (the same
    without a conformal part), over HTTP and gRPC."""
    tmp = tmp_path_factory.mktemp("decisions-protocols")
    repository = tmp / "repository"
    copy_version(with_thresholds(tiny_artifact, tmp / "tiny", {"0.42": 0.0, "0.2": 1.0}), repository, "tiny", "1")
    copy_version(without_conformal(tiny_artifact, tmp / "plain"), repository, "plain", "1")
    port = free_port()
    settings = settings_for(repository, tmp, default_model="tiny", grpc_port=port, max_inputs_per_request=LIMIT)
    with serve(settings) as running:
        yield Served(running, f"127.0.0.1:{port}", repository)


def predicted(served: Served, **fields: Any) -> dict[str, Any]:
    """``/predict``'s answer for ``PIXELS`` under ``SEEDED``."""
    body = {"model": "tiny", "inputs": [{"pixels": p} for p in PIXELS], **SEEDED, **fields}
    response = httpx.post(f"{served.running.url}/predict", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def sets_of(values: np.ndarray) -> list[list[str]]:
    """A ``prediction_set`` output as label lists: each element a JSON array string (str or bytes)."""
    return [json.loads(value) for value in values.tolist()]


def assert_same_decisions(result: Any, expected: dict[str, Any]) -> None:
    """An OIP result's sets, sizes, abstentions and labels equal ``/predict``'s predictions."""
    predictions = expected["predictions"]
    assert sets_of(result.as_numpy("prediction_set")) == [p["prediction_set"] for p in predictions]
    sizes = result.as_numpy("set_size")
    assert sizes.dtype == np.int64 and sizes.tolist() == [p["set_size"] for p in predictions]
    abstain = result.as_numpy("abstain")
    assert abstain.dtype == np.bool_ and abstain.tolist() == [p["abstain"] for p in predictions]
    exchangeable = result.as_numpy("exchangeable")
    assert exchangeable.dtype == np.bool_ and exchangeable.tolist() == [p["exchangeable"] for p in predictions]
    labels = [v.decode() if isinstance(v, bytes) else v for v in result.as_numpy("label").tolist()]
    assert labels == [p["label"] for p in predictions]


def pixels_tensor(module: Any, count: int = len(PIXELS), binary: bool = True) -> Any:
    data = np.resize(np.asarray(PIXELS, dtype=np.float32), (count, 1, 28, 28))
    tensor = module.InferInput("pixels", list(data.shape), "FP32")
    if module is triton_http:
        tensor.set_data_from_numpy(data, binary_data=binary)
    else:
        tensor.set_data_from_numpy(data)
    return tensor


def oip_json(served: Served, parameters: dict[str, Any], model: str = "tiny",
             outputs: list[str] | None = None) -> httpx.Response:
    body: dict[str, Any] = {"inputs": [{"name": "pixels", "datatype": "FP32", "shape": [1, 1, 28, 28],
                                        "data": PIXELS[0]}], "parameters": parameters}
    if outputs is not None:
        body["outputs"] = [{"name": name} for name in outputs]
    return httpx.post(f"{served.running.url}/v2/models/{model}/infer", json=body, timeout=60)


BAD_ASKS = [{"coverage": "0.9"}, {"coverage": 1.0}, {"coverage": 0.3}, {"max_risk": 0}, {"max_risk": True},
            {"conformal_score": "topk", "coverage": 0.9}, {"class_conditional": "yes", "coverage": 0.9},
            {"abstain_if_ood": 1, "max_risk": 0.2}, {"conformal_score": "aps"}, {"abstain_if_ood": False}]


# ---- OIP over HTTP -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("binary", [True, False])
def test_oip_http_answers_the_sets_and_abstentions_predict_gives(served: Served, binary: bool) -> None:
    """tritonclient asks every output binary when it names none; named ones here travel as JSON."""
    client = triton_http.InferenceServerClient(served.running.url.removeprefix("http://"), network_timeout=60.0)
    outputs = None if binary else [triton_http.InferRequestedOutput(name, binary_data=False)
                                   for name in ("label", *DECISION_OUTPUTS)]
    result = client.infer("tiny", [pixels_tensor(triton_http)], parameters={**SEEDED, **ASK}, outputs=outputs)
    expected = predicted(served, **ASK)
    assert_same_decisions(result, expected)
    for name in DECISION_OUTPUTS:
        output = result.get_output(name)
        assert output["shape"] == [len(PIXELS)] and ("data" in output) is not binary, output
    assert result.get_output("prediction_set")["datatype"] == "BYTES"
    parameters = result.get_response()["parameters"]
    assert {k: v for k, v in parameters.items() if k not in OWN_PARAMETERS} == expected["decisions"]
    assert parameters["risk_level"] == 0.42 and parameters["delta"] == 0.1 and parameters["coverage"] == 0.9
    assert parameters["confidence_threshold"] == 0.0 and not result.as_numpy("abstain").any()


def test_oip_http_abstentions_follow_the_threshold_and_the_shift_signal(served: Served) -> None:
    client = triton_http.InferenceServerClient(served.running.url.removeprefix("http://"), network_timeout=60.0)
    for max_risk in (0.42, 0.2):  # confidence >= 0: every input answered unless not exchangeable; >= 1: none
        result = client.infer("tiny", [pixels_tensor(triton_http)], parameters={**SEEDED, "max_risk": max_risk})
        expected = predicted(served, max_risk=max_risk)
        abstain = result.as_numpy("abstain").tolist()
        assert abstain == [p["abstain"] for p in expected["predictions"]]
        assert abstain == ([not p["exchangeable"] for p in expected["predictions"]] if max_risk == 0.42
                           else [True] * 6)
        assert result.as_numpy("exchangeable").tolist() == [p["exchangeable"] for p in expected["predictions"]]
        assert result.get_response()["parameters"]["confidence_threshold"] == (0.0 if max_risk == 0.42 else 1.0)


def test_oip_http_outputs_follow_what_is_asked(served: Served) -> None:
    only_sets = oip_json(served, {"coverage": 0.8}, outputs=["prediction_set", "label"])
    assert only_sets.status_code == 200, only_sets.text
    body = only_sets.json()
    assert [o["name"] for o in body["outputs"]] == ["prediction_set", "label"]
    assert isinstance(json.loads(body["outputs"][0]["data"][0]), list) and "max_risk" not in body["parameters"]
    every = oip_json(served, {"max_risk": 0.3}).json()  # no outputs named: every one, abstain among them
    names = [o["name"] for o in every["outputs"]]
    assert names[-2:] == ["abstain", "exchangeable"] and "prediction_set" not in names and "label" in names
    plain = oip_json(served, {}).json()  # nothing asked: the outputs and parameters as before
    assert not set(DECISION_OUTPUTS) & {o["name"] for o in plain["outputs"]}
    assert set(plain["parameters"]) == OWN_PARAMETERS
    for parameters, output, needed in (({}, "prediction_set", "coverage"), ({"coverage": 0.9}, "abstain", "max_risk"),
                                       ({"max_risk": 0.2}, "set_size", "coverage")):
        refused = oip_json(served, parameters, outputs=[output])
        assert refused.status_code == 400, refused.text
        assert f"output {output!r} needs the parameter {needed}" in refused.json()["error"]


def test_oip_http_refuses_an_uncalibrated_version_and_bad_asks(served: Served) -> None:
    plain = oip_json(served, {"coverage": 0.9}, model="plain")
    assert plain.status_code == 400 and "plain" in plain.json()["error"]
    assert "no conformal calibration" in plain.json()["error"] and "export" in plain.json()["error"]
    assert oip_json(served, {}, model="plain").status_code == 200  # asking nothing: served as before
    for ask in BAD_ASKS:
        response = oip_json(served, ask)
        assert response.status_code == 422, (ask, response.text)
        body = response.json()
        assert body["type"] and body["status"] == 422 and "Traceback" not in response.text, ask
    named = oip_json(served, {"coverage": "0.9"}).json()
    assert "coverage must be a number" in named["error"]
    assert named["details"][0]["loc"] == ["body", "parameters", "coverage"]


# ---- OIP over gRPC -----------------------------------------------------------------------------------------------

@pytest.fixture
def grpc_client(served: Served) -> triton_grpc.InferenceServerClient:
    return triton_grpc.InferenceServerClient(served.grpc_address)


def test_grpc_answers_the_sets_and_abstentions_predict_gives(served: Served,
                                                             grpc_client: triton_grpc.InferenceServerClient) -> None:
    result = grpc_client.infer("tiny", [pixels_tensor(triton_grpc)], parameters={**SEEDED, **ASK})
    expected = predicted(served, **ASK)
    assert_same_decisions(result, expected)
    response = result.get_response()
    parameters = {name: getattr(value, value.WhichOneof("parameter_choice"))
                  for name, value in response.parameters.items() if name not in OWN_PARAMETERS}
    assert parameters == expected["decisions"]
    assert response.parameters["coverage"].double_param == 0.9
    assert response.parameters["abstain_if_ood"].bool_param is False
    named = grpc_client.infer("tiny", [pixels_tensor(triton_grpc)], parameters={"coverage": 0.8},
                              outputs=[triton_grpc.InferRequestedOutput("set_size")])
    assert [o.name for o in named.get_response().outputs] == ["set_size"]
    assert named.as_numpy("set_size").shape == (len(PIXELS),)


def test_grpc_refusals_are_invalid_argument(grpc_client: triton_grpc.InferenceServerClient) -> None:
    """A version without calibration is HTTP's 400, and a bad ask HTTP's 422: both INVALID_ARGUMENT."""
    tensor = pixels_tensor(triton_grpc, 1)
    cases: list[tuple[str, dict[str, Any], list[str] | None, str]] = [
        ("plain", {"coverage": 0.9}, None, "no conformal calibration"),
        ("tiny", {"coverage": 1.5}, None, "coverage must be between 0 and 1"),
        ("tiny", {"max_risk": 0.2, "conformal_score": "topk"}, None, "conformal_score must be one of"),
        ("tiny", {"class_conditional": True}, None, "give coverage too"),
        ("tiny", {"coverage": 0.3}, None, "[0.5, 0.999]"),
        ("tiny", {}, ["prediction_set"], "needs the parameter coverage")]
    for model, parameters, outputs, message in cases:
        wanted = None if outputs is None else [triton_grpc.InferRequestedOutput(name) for name in outputs]
        with pytest.raises(InferenceServerException) as error:
            grpc_client.infer(model, [tensor], parameters=parameters, outputs=wanted)
        assert "INVALID_ARGUMENT" in str(error.value) and message in str(error.value), str(error.value)


# ---- the outputs declared in the metadata and the configuration ----------------------------------------------

DECLARED = {"prediction_set": ("BYTES", "TYPE_STRING", "coverage"), "set_size": ("INT64", "TYPE_INT64", "coverage"),
            "abstain": ("BOOL", "TYPE_BOOL", "max_risk"),
            "exchangeable": ("BOOL", "TYPE_BOOL", "coverage or max_risk")}  # name: (OIP datatype, Triton type, ask)


def test_http_metadata_and_config_declare_the_outputs_as_they_are_returned(served: Served) -> None:
    client = triton_http.InferenceServerClient(served.running.url.removeprefix("http://"), network_timeout=60.0)
    outputs = {o["name"]: o for o in client.get_model_metadata("tiny")["outputs"]}
    config = client.get_model_config("tiny")
    configured = {o["name"]: o for o in config["output"]}
    result = client.infer("tiny", [pixels_tensor(triton_http)], parameters={**SEEDED, **ASK})
    for name, (datatype, triton_type, ask) in DECLARED.items():
        assert outputs[name]["datatype"] == datatype and outputs[name]["shape"] == [-1]
        assert outputs[name]["parameters"]["requires"] == ask and ask in outputs[name]["parameters"]["description"]
        assert configured[name] == {"name": name, "data_type": triton_type, "dims": [1], "reshape": {"shape": []}}
        returned = result.get_output(name)  # the batch dimension, then what the declarations say
        assert returned["datatype"] == datatype and returned["shape"] == [len(PIXELS)]
    assert list(outputs)[-4:] == list(DECLARED) and list(configured)[-4:] == list(DECLARED)
    parameters = {key: value["string_value"] for key, value in config["parameters"].items()}
    assert json.loads(parameters["decision_outputs"]) == {name: ask for name, (_, _, ask) in DECLARED.items()}
    assert "only when" in parameters["decision_outputs_note"]
    plain = client.get_model_metadata("plain")  # no conformal part: none of them, nowhere
    plain_config = client.get_model_config("plain")
    assert not set(DECLARED) & {o["name"] for o in [*plain["outputs"], *plain_config["output"]]}
    assert "decision_outputs" not in plain_config["parameters"]
    assert [o["name"] for o in plain["outputs"]] == [name for name in outputs if name not in DECLARED]


def test_grpc_metadata_and_config_declare_them_too(grpc_client: triton_grpc.InferenceServerClient) -> None:
    for model, calibrated in (("tiny", True), ("plain", False)):
        metadata = grpc_client.get_model_metadata(model, as_json=True)
        outputs = {o["name"]: (o["datatype"], [int(d) for d in o["shape"]]) for o in metadata["outputs"]}
        config = grpc_client.get_model_config(model, as_json=True)["config"]
        configured = {o["name"]: o["data_type"] for o in config["output"]}
        for name, (datatype, triton_type, _) in DECLARED.items():
            assert outputs.get(name) == ((datatype, [-1]) if calibrated else None)
            assert configured.get(name) == (triton_type if calibrated else None)
        assert ("decision_outputs" in config["parameters"]) is calibrated


def test_every_declared_output_named_without_its_ask_is_left_out(
        served: Served, grpc_client: triton_grpc.InferenceServerClient) -> None:
    """What perf_analyzer and Model Analyzer send: every output the metadata declares, by name, and no ask."""
    every = [o["name"] for o in oip_json(served, {}).json()["outputs"]] + list(DECLARED)
    plain = oip_json(served, {}, outputs=every)
    assert plain.status_code == 200, plain.text
    assert [o["name"] for o in plain.json()["outputs"]] == every[:-4]
    left_out = ("prediction_set (needs coverage), set_size (needs coverage), abstain (needs max_risk), exchangeable "
                "(needs coverage or max_risk)")
    assert plain.json()["parameters"]["outputs_left_out"] == left_out  # said, not silently dropped
    with_sets = oip_json(served, {"coverage": 0.9}, outputs=every).json()
    assert [o["name"] for o in with_sets["outputs"]] == [*every[:-2], "exchangeable"]  # abstain needs max_risk
    assert with_sets["parameters"]["outputs_left_out"] == "abstain (needs max_risk)"
    assert "outputs_left_out" not in oip_json(served, {"coverage": 0.9, "max_risk": 0.1}, outputs=every).json()[
        "parameters"]
    named = grpc_client.infer("tiny", [pixels_tensor(triton_grpc, 2)],
                              outputs=[triton_grpc.InferRequestedOutput(name) for name in every])
    assert [o.name for o in named.get_response().outputs] == every[:-4]
    assert named.get_response().parameters["outputs_left_out"].string_param == left_out


# ---- the input count, from the declared shape -------------------------------------------------------------------

def spied(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> list[int]:
    """Count the calls of ``module.name`` (still run)."""
    calls: list[int] = []
    original: Callable[..., Any] = getattr(module, name)

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, spy)
    return calls


def typed_request(count: int) -> Any:
    request = pb.ModelInferRequest(model_name="tiny")
    tensor = request.inputs.add(name="pixels", datatype="FP32", shape=[count, 1, 28, 28])
    tensor.contents.fp32_contents.extend([0.5] * (count * 784))
    return request


def test_too_many_inputs_are_refused_before_the_tensor_is_converted(
        served: Served, grpc_client: triton_grpc.InferenceServerClient, monkeypatch: pytest.MonkeyPatch) -> None:
    converted = spied(monkeypatch, oip, "numeric_array")
    typed = spied(monkeypatch, grpc_tensors, "contents_bytes")
    http = triton_http.InferenceServerClient(served.running.url.removeprefix("http://"), network_timeout=60.0)
    for binary in (True, False):
        with pytest.raises(InferenceServerException, match=f"{LIMIT + 1} inputs in one request, the limit is {LIMIT}"):
            http.infer("tiny", [pixels_tensor(triton_http, LIMIT + 1, binary)])
    with pytest.raises(InferenceServerException, match="RESOURCE_EXHAUSTED"):
        grpc_client.infer("tiny", [pixels_tensor(triton_grpc, LIMIT + 1)])  # raw_input_contents
    with grpc.insecure_channel(served.grpc_address) as channel:  # typed contents, which tritonclient never sends
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            stub.ModelInfer(typed_request(LIMIT + 1))
        assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert refused.value.details() == f"{LIMIT + 1} inputs in one request, the limit is {LIMIT}"
        assert converted == [] and typed == []  # refused on the shapes: no tensor was converted
        http.infer("tiny", [pixels_tensor(triton_http, LIMIT)])
        assert len(stub.ModelInfer(typed_request(LIMIT)).outputs) > 0
    assert len(converted) == 2 and len(typed) == 1  # the spies are on the path a request at the limit takes


# ---- offline batch scoring ---------------------------------------------------------------------------------------

def test_batch_scoring_writes_the_sets_and_abstentions_predict_gives(served: Served, tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"id": f"x{i}", "pixels": p}) + "\n" for i, p in enumerate(PIXELS)))
    out = tmp_path / "scores.jsonl"
    common = ["--model-repository", str(served.repository), "--input", str(source), "--threads", "1",
              "--n-samples", "4", "--seed", "7"]
    flags = ["--coverage", "0.9", "--conformal-score", "lac", "--max-risk", "0.42", "--no-abstain-if-ood",
             "--no-widen-if-shifted"]
    assert score_main([*common, "--model", "tiny", "--output", str(out), *flags]) == 0
    rows = {row["key"]: row for row in map(json.loads, out.read_text().splitlines())}
    expected = predicted(served, **ASK)
    for i, prediction in enumerate(expected["predictions"]):
        row = rows[f"x{i}"]
        assert {k: row[k] for k in ("label", "prediction_set", "set_size", "abstain")} == {
            k: prediction[k] for k in ("label", "prediction_set", "set_size", "abstain")}
        assert row["decisions"] == expected["decisions"]
    assert score_main([*common, "--model", "plain", "--output", str(tmp_path / "plain.jsonl"), *flags]) == 2
    assert score_main([*common, "--model", "tiny", "--output", str(tmp_path / "half.jsonl"),
                       "--conformal-score", "aps"]) == 2  # a set's option without a coverage
    with pytest.raises(SystemExit) as exit_:
        score_main([*common, "--model", "tiny", "--output", str(tmp_path / "bad.jsonl"), "--coverage", "1.5"])
    assert exit_.value.code == 2
    assert not (tmp_path / "plain.jsonl").exists() and not (tmp_path / "bad.jsonl").exists()
