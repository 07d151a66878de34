"""A version that serves the hybrid (``method: hybrid``: the backbone's own forward for the labels, the DIRECTOR kernel
beside it for its error) through every entry point: ``/predict``, the Open Inference Protocol over HTTP and gRPC (the
real tritonclient) and the offline batch scorer give the same answers; its labels are the backbone's, every sample the
same row; its OOD score reads the kernel error; prediction sets are answered; ``GET /models`` and the Triton
configuration say what it is."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http

from service.batch_scoring import main as score_main
from tests.service.conftest import Running, copy_version, random_pixels, serve, settings_for
from tests.service.test_grpc import free_port
from training.config import load_config
from training.loading import load_backbone
from training.posthoc.writing import load_scripted

PIXELS = random_pixels(np.random.default_rng(3), 5)  # [5][1][28][28], 4 decimals: exact in float32
ASK = {"n_samples": 4, "seed": 7, "coverage": 0.9}


@pytest.fixture(scope="module")
def hybrid_server(hybrid_export: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
                  ) -> Iterator[tuple[Running, str, Path]]:
    tmp = tmp_path_factory.mktemp("hybrid-server")
    copy_version(hybrid_export[1], tmp / "repo", "tiny", "1")
    port = free_port()
    with serve(settings_for(tmp / "repo", tmp, grpc_port=port)) as running:
        yield running, f"127.0.0.1:{port}", tmp / "repo"


def predicted(url: str) -> dict[str, Any]:
    response = httpx.post(f"{url}/predict", timeout=60, json={"inputs": [{"pixels": p} for p in PIXELS], **ASK})
    assert response.status_code == 200, response.text
    return response.json()


def test_predict_answers_the_backbone_labels_and_reads_the_kernel_error(
        hybrid_server: tuple[Running, str, Path], hybrid_export: tuple[Path, Path]) -> None:
    running, _, _ = hybrid_server
    config, folder = hybrid_export
    manifest = json.loads((folder / "manifest.json").read_text())
    body = predicted(running.url)
    assert body["n_samples"] == 4 and body["ood"]["score"] == manifest["ood"]["score"]
    with torch.no_grad():
        backbone = load_backbone(load_config(config).run_dir).eval()(torch.tensor(PIXELS))  # [5, C]
    labels = manifest["labels"]
    assert [p["label"] for p in body["predictions"]] == [labels[i] for i in backbone.argmax(-1).tolist()]
    for prediction in body["predictions"]:
        assert prediction["mutual_information"] == 0.0
        assert prediction["is_ood"] == (prediction["ood_score"] > manifest["ood"]["thresholds"]["4"]["threshold"])
        assert prediction["set_size"] == len(prediction["prediction_set"]) >= 0
    # the OOD score moves with the kernel error: a scripted call of the served file gives the same error column
    ones = torch.ones(len(PIXELS), dtype=torch.long)
    _, scores = load_scripted(folder / "director.ts").scored_rows(torch.tensor(PIXELS), ones)  # [5, F]
    assert manifest["artifact"]["input_scores"][0] == "kernel_error" and bool((scores[:, 0] > 0).all())


def test_oip_over_http_and_grpc_and_the_batch_scorer_answer_as_predict(hybrid_server: tuple[Running, str, Path],
                                                                       tmp_path: Path) -> None:
    running, grpc_address, repository = hybrid_server
    expected = predicted(running.url)["predictions"]
    data = np.asarray(PIXELS, dtype=np.float32)
    parameters = dict(ASK)
    for module, client in ((triton_http, triton_http.InferenceServerClient(running.url.removeprefix("http://"),
                                                                           network_timeout=60.0)),
                           (triton_grpc, triton_grpc.InferenceServerClient(grpc_address))):
        tensor = module.InferInput("pixels", list(data.shape), "FP32")
        tensor.set_data_from_numpy(data)
        result = client.infer("tiny", [tensor], parameters=parameters)
        labels = [v.decode() if isinstance(v, bytes) else v for v in result.as_numpy("label").tolist()]
        assert labels == [p["label"] for p in expected], module.__name__
        np.testing.assert_allclose(result.as_numpy("ood_score"), [p["ood_score"] for p in expected], rtol=1e-5)
        sets = [json.loads(v) for v in result.as_numpy("prediction_set").tolist()]
        assert sets == [p["prediction_set"] for p in expected], module.__name__
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"id": f"x{i}", "pixels": p}) + "\n" for i, p in enumerate(PIXELS)))
    out = tmp_path / "scores.jsonl"
    assert score_main(["--model-repository", str(repository), "--model", "tiny", "--input", str(source), "--output",
                       str(out), "--threads", "1", "--n-samples", "4", "--seed", "7", "--coverage", "0.9"]) == 0
    rows = {row["key"]: row for row in map(json.loads, out.read_text().splitlines())}
    for i, prediction in enumerate(expected):
        row = rows[f"x{i}"]
        assert (row["label"], row["prediction_set"]) == (prediction["label"], prediction["prediction_set"])
        assert row["ood_score"] == pytest.approx(prediction["ood_score"], rel=1e-5)


def test_models_and_the_triton_config_say_it_serves_the_hybrid(hybrid_server: tuple[Running, str, Path],
                                                               hybrid_export: tuple[Path, Path]) -> None:
    running, _, _ = hybrid_server
    sentence = json.loads((hybrid_export[1] / "manifest.json").read_text())["kernel_verdict"]["sentence"]
    version = httpx.get(f"{running.url}/models/tiny", timeout=10).json()["versions"][0]
    assert version["method"] == "hybrid" and version["kernel_verdict"] == sentence
    assert version["samples_informative"] is False and "hybrid" in version["samples_note"]
    config = httpx.get(f"{running.url}/v2/models/tiny/config", timeout=10).json()
    assert config["parameters"]["method"]["string_value"] == "hybrid"
    assert config["parameters"]["kernel_verdict"]["string_value"] == sentence
