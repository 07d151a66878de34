"""Triton's model-configuration and statistics extensions (``service.api.model_config``,
``service.observability.statistics``), read by the real tritonclient[http] client over a real server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from service.engine.artifact import ood_rule
from tests.service.conftest import TEXT_MODEL, Running, copy_version, serve, settings_for, wait_for
from tests.service.test_oip import pixels_input


@pytest.fixture
def client(tiny_server: Running) -> triton.InferenceServerClient:
    return triton.InferenceServerClient(url=tiny_server.url.removeprefix("http://"), network_timeout=30.0)


def test_model_config_matches_the_metadata_and_the_settings(client: triton.InferenceServerClient,
                                                            tiny_server: Running) -> None:
    settings = tiny_server.app_state.settings
    config = client.get_model_config("tiny")
    assert config == client.get_model_config("tiny", "1")
    meta = client.get_model_metadata("tiny")
    assert config["name"] == "tiny" and config["max_batch_size"] == settings.max_inputs_per_request
    # Triton's rule: with max_batch_size > 0 the metadata shape is [-1] + the config's dims
    for config_input, meta_input in zip(config["input"], meta["inputs"], strict=True):
        assert [-1, *config_input["dims"]] == meta_input["shape"]
        assert config_input["data_type"] == "TYPE_" + meta_input["datatype"]
    types = {"FP32": "TYPE_FP32", "BOOL": "TYPE_BOOL", "BYTES": "TYPE_STRING", "INT64": "TYPE_INT64"}
    assert {o["name"]: o["data_type"] for o in config["output"]} == {
        o["name"]: types[o["datatype"]] for o in meta["outputs"]}
    batching = config["dynamic_batching"]
    assert batching["max_queue_delay_microseconds"] == settings.max_batch_delay_ms * 1000
    queue = batching["default_queue_policy"]
    assert queue["max_queue_size"] == settings.max_queue
    assert queue["default_timeout_microseconds"] == settings.request_timeout_s * 1e6
    assert config["instance_group"][0]["kind"] == "KIND_CPU"
    parameters = {key: value["string_value"] for key, value in config["parameters"].items()}
    assert int(parameters["n_samples_default"]) >= 1 and parameters["method"] == "director"
    assert int(parameters["n_samples_max"]) >= int(parameters["n_samples_default"])
    artifact = tiny_server.app_state.repository.default_version("tiny").artifact
    assert parameters["ood_score"] == ood_rule(artifact.manifest.ood, artifact.default_samples).score
    assert json.loads(parameters["ood_thresholds"]).keys() == {str(k) for k in artifact.manifest.ood.thresholds}


def test_text_model_config_takes_one_string_per_input(text_server: Running) -> None:
    client = triton.InferenceServerClient(url=text_server.url.removeprefix("http://"), network_timeout=30.0)
    config = client.get_model_config(TEXT_MODEL)
    assert config["input"] == [{"name": "text", "data_type": "TYPE_STRING", "dims": [1], "reshape": {"shape": []}}]
    assert "max_batch_tokens" in config["parameters"]
    texts = np.array([["a warm and funny film."], ["dull."]], dtype=object)  # [N, 1], as Triton clients batch
    tensor = triton.InferInput("text", list(texts.shape), "BYTES")
    tensor.set_data_from_numpy(texts)
    assert client.infer(TEXT_MODEL, [tensor]).as_numpy("probabilities").shape[0] == 2


def test_unknown_models_and_versions_are_404(client: triton.InferenceServerClient) -> None:
    for call in (lambda: client.get_model_config("nope"), lambda: client.get_model_config("tiny", "9"),
                 lambda: client.get_inference_statistics("nope"),
                 lambda: client.get_inference_statistics("tiny", "9")):
        with pytest.raises(InferenceServerException) as raised:
            call()
        assert raised.value.status() == "404"


def test_statistics_count_requests_queue_and_forwards(client: triton.InferenceServerClient) -> None:
    def stats() -> dict:
        (only,) = client.get_inference_statistics("tiny", "1")["model_stats"]
        return only

    before = stats()
    for batch in (1, 3):
        client.infer("tiny", [pixels_input(batch, binary=True)], parameters={"n_samples": 2})
    with pytest.raises(InferenceServerException):
        client.infer("tiny", [pixels_input(1, binary=True)], parameters={"n_samples": 10_000})
    after = stats()
    success = after["inference_stats"]["success"]
    assert success["count"] == before["inference_stats"]["success"]["count"] + 2 and success["ns"] > 0
    assert after["inference_count"] == before["inference_count"] + 4  # inputs
    assert after["execution_count"] - before["execution_count"] in (1, 2)  # the two may share a forward
    queue, compute = after["inference_stats"]["queue"], after["inference_stats"]["compute_infer"]
    assert queue["count"] == compute["count"] == success["count"]
    assert compute["ns"] <= success["ns"]  # a request's forward is part of its time end to end
    assert after["last_inference"] > 0 and {b["batch_size"] for b in after["batch_stats"]} & {1, 3, 4}
    everything = client.get_inference_statistics()["model_stats"]
    assert [(s["name"], s["version"]) for s in everything] == [("tiny", "1")]


KEY = "a-long-random-key"


@pytest.fixture
def controlled(tiny_artifact: Path, tmp_path: Path) -> Iterator[tuple[Running, triton.InferenceServerClient]]:
    """A server with an API key over a repository of its own: ``tiny`` 1, and ``broken`` 1 (tiny's files with
    ``director.ts`` altered after its digest was written)."""
    repository = tmp_path / "repository"
    copy_version(tiny_artifact, repository, "tiny", "1")
    broken = copy_version(tiny_artifact, repository, "broken", "1")
    with (broken / "director.ts").open("ab") as module:
        module.write(b"\0")
    with serve(settings_for(repository, tmp_path, api_key=KEY, poll_interval_s=0.1)) as running:
        yield running, triton.InferenceServerClient(url=running.url.removeprefix("http://"), network_timeout=30.0)


def index(client: triton.InferenceServerClient) -> dict[str, str]:
    return {f"{row['name']}/{row['version']}": row["state"]
            for row in client.get_model_repository_index(headers=auth())}


def auth() -> dict[str, str]:
    """A new dict per call: tritonclient adds its Content-Length to the headers it is given."""
    return {"Authorization": f"Bearer {KEY}"}


def test_unload_then_load_over_tritonclient(controlled: tuple[Running, triton.InferenceServerClient],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    running, client = controlled
    assert index(client) == {"tiny/1": "READY", "broken/1": "UNAVAILABLE"}
    client.unload_model("tiny", headers=auth())
    assert not client.is_model_ready("tiny", headers=auth())
    with pytest.raises(InferenceServerException) as raised:
        client.infer("tiny", [pixels_input(1, binary=True)], headers=auth())
    assert raised.value.status() == "404"
    assert index(client) == {"broken/1": "UNAVAILABLE", "tiny/": "UNAVAILABLE"}  # unloaded: listed by name
    repository, scans = running.app_state.repository, []
    scan = repository.scan

    async def counted_scan() -> None:
        await scan()
        scans.append(1)

    monkeypatch.setattr(repository, "scan", counted_scan)
    wait_for(lambda: len(scans) >= 5, "five polls of the repository")
    assert not client.is_model_ready("tiny", headers=auth())  # polling leaves an unloaded model alone
    client.load_model("tiny", headers=auth())
    assert client.is_model_ready("tiny", headers=auth())
    assert client.infer("tiny", [pixels_input(2, binary=True)], headers=auth()).as_numpy("label").shape == (2,)


def test_a_load_runs_the_artifact_checks_and_needs_the_key(
        controlled: tuple[Running, triton.InferenceServerClient]) -> None:
    _, client = controlled
    with pytest.raises(InferenceServerException) as raised:
        client.load_model("broken", headers=auth())
    assert raised.value.status() == "400" and "sha256" in str(raised.value) and "/tmp" not in str(raised.value)
    for call, status in ((lambda: client.load_model("nope", headers=auth()), "404"),
                         (lambda: client.unload_model("nope", headers=auth()), "404"),
                         (lambda: client.load_model("tiny"), "401"),
                         (lambda: client.get_model_repository_index(), "401")):
        with pytest.raises(InferenceServerException) as raised:
            call()
        assert raised.value.status() == status


def test_model_control_is_refused_without_an_api_key(client: triton.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as raised:
        client.unload_model("tiny")
    assert raised.value.status() == "403" and "API key" in str(raised.value)
    assert client.is_model_ready("tiny")
    assert {row["name"] for row in client.get_model_repository_index()} == {"tiny"}  # reading needs no control


def test_cors_is_off_by_default_and_answers_preflight_when_set(tiny_server: Running, tiny_repository: Path,
                                                               tmp_path: Path) -> None:
    preflight = {"Origin": "https://app.example.com", "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization, content-type"}
    off = httpx.options(f"{tiny_server.url}/v2/models/tiny/infer", headers=preflight, timeout=30)
    assert "access-control-allow-origin" not in off.headers
    settings = settings_for(tiny_repository, tmp_path, api_key=KEY, cors_origins="https://app.example.com")
    with serve(settings) as running:
        allowed = httpx.options(f"{running.url}/v2/models/tiny/infer", headers=preflight, timeout=30)
        assert allowed.status_code == 200  # before the key check: a preflight carries no credentials
        assert allowed.headers["access-control-allow-origin"] == "https://app.example.com"
        assert "authorization" in allowed.headers["access-control-allow-headers"].lower()
        other = httpx.options(f"{running.url}/v2/models/tiny/infer", timeout=30,
                              headers={**preflight, "Origin": "https://evil.example.com"})
        assert other.status_code == 400 and "access-control-allow-origin" not in other.headers
        # preflights are answered like everything else: an id (the caller's when valid), errors in the JSON shape
        assert allowed.headers["x-request-id"] and other.headers["x-request-id"]
        assert (other.json()["error"], other.json()["status"]) == ("Disallowed CORS origin", 400)
        echoed = httpx.options(f"{running.url}/v2/models/tiny/infer", timeout=30,
                               headers={**preflight, "X-Request-ID": "trace-me-1"})
        assert echoed.headers["x-request-id"] == "trace-me-1"
        answered = httpx.post(f"{running.url}/v2/models/tiny/infer", timeout=30,
                              headers={"Origin": "https://app.example.com", **auth()},
                              json={"inputs": [{"name": "pixels", "datatype": "FP32", "shape": [1, 1, 28, 28],
                                                "data": [0.0] * 784}]})
        assert answered.status_code == 200
        assert answered.headers["access-control-allow-origin"] == "https://app.example.com"
