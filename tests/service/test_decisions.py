"""Prediction sets and abstentions over HTTP: a version exported with its conformal part answers ``coverage`` and
``max_risk`` per input (the sets the maths gives on the served probabilities, the threshold of the calibrated risk
level), over /predict and the upload route; a version without one answers 400, and out-of-range asks 422."""

from __future__ import annotations

import base64
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch

from artifact.conformal import CONFORMAL_FILE
from artifact.contract import MANIFEST
from models.conformal import ConformalTable, ScoreRule
from tests.service.conftest import Running, copy_version, png_base64, random_pixels, rehash, serve, settings_for


def without_conformal(source: Path, target: Path) -> Path:
    """A copy of ``source`` as a version exported before format 1.6: no conformal part, re-hashed."""
    shutil.copytree(source, target)
    manifest = json.loads((target / MANIFEST).read_text())
    del manifest["conformal"], manifest["files"][CONFORMAL_FILE]
    (target / CONFORMAL_FILE).unlink()
    rehash(target, manifest)
    return target


@pytest.fixture(scope="module")
def server(tiny_artifact: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Running, Path]]:
    tmp = tmp_path_factory.mktemp("decisions")
    repository = tmp / "repository"
    copy_version(tiny_artifact, repository, "tiny", "1")  # as exported: calibrated on its carved-off split
    copy_version(without_conformal(tiny_artifact, tmp / "plain"), repository, "plain", "1")
    with serve(settings_for(repository, tmp, default_model="tiny")) as running:
        yield running, tiny_artifact


def predict(running: Running, **fields: Any) -> httpx.Response:
    inputs = [{"pixels": p} for p in random_pixels(np.random.default_rng(1), 6)]
    return httpx.post(f"{running.url}/predict", json={"inputs": inputs, **fields}, timeout=60)


def file_table(folder: Path, score: str) -> ConformalTable:
    document = json.loads((folder / CONFORMAL_FILE).read_text())
    return ConformalTable(ScoreRule(score), torch.tensor(document["scores"][score], dtype=torch.float64))


def test_coverage_gives_each_input_the_set_the_calibration_gives(server: tuple[Running, Path]) -> None:
    running, folder = server
    # random pixels may look shifted to the tiny model (or drift its live window): the calibrated sets, guard off
    response = predict(running, coverage=0.9, conformal_score="lac", widen_if_shifted=False)
    assert response.status_code == 200, response.text
    body = response.json()
    labels = list(body["predictions"][0]["probabilities"])
    probs = torch.tensor([[p["probabilities"][name] for name in labels] for p in body["predictions"]],
                         dtype=torch.float64)  # [n, C] as served
    expected = file_table(folder, "lac").sets(probs, 0.9)
    for prediction, indices in zip(body["predictions"], expected, strict=True):
        assert prediction["prediction_set"] == [labels[i] for i in indices]  # most probable first
        assert prediction["set_size"] == len(indices) and "abstain" not in prediction
    assert {k: v for k, v in body["decisions"].items() if k != "shift"} == {
        "coverage": 0.9, "conformal_score": "lac", "class_conditional": False, "widen_if_shifted": False}
    default = predict(running, coverage=0.9, conformal_score="aps").json()
    assert default["decisions"]["conformal_score"] == "aps"
    manifest = json.loads((folder / "manifest.json").read_text())
    unnamed = predict(running, coverage=0.9).json()  # the version's default score
    assert unnamed["decisions"]["conformal_score"] == manifest["conformal"]["default_score"] == "lac"


def test_max_risk_abstains_below_the_calibrated_threshold(server: tuple[Running, Path]) -> None:
    running, folder = server
    thresholds = json.loads((folder / CONFORMAL_FILE).read_text())["selective"]["thresholds"]
    body = predict(running, max_risk=0.42, abstain_if_ood=False).json()
    decisions = body["decisions"]
    assert decisions["risk_level"] == 0.42 and decisions["delta"] == 0.1  # a calibrated level: used as it is
    threshold = thresholds["0.42"]
    assert decisions.get("confidence_threshold") == threshold
    for prediction in body["predictions"]:
        assert prediction["abstain"] is (threshold is None or prediction["confidence"] < threshold)
    between = predict(running, max_risk=0.4237).json()["decisions"]  # the largest level at or below it
    assert between["risk_level"] == 0.42 and between["abstain_if_ood"] is True
    none = predict(running, max_risk=0.001).json()  # below every calibrated level: nobody is answered
    assert all(p["abstain"] for p in none["predictions"]) and "below the smallest risk level" in none["decisions"][
        "reason"]


def test_a_version_without_calibration_or_an_ask_out_of_range_is_refused(server: tuple[Running, Path]) -> None:
    running, _ = server
    plain = predict(running, model="plain", coverage=0.9)
    assert plain.status_code == 400 and "no conformal calibration" in plain.json()["error"]
    assert "plain" in plain.json()["error"]
    assert predict(running, model="plain").status_code == 200  # asking nothing: served as before
    low = predict(running, coverage=0.3)
    assert low.status_code == 422 and "[0.5, 0.999]" in low.json()["error"]
    for bad in ({"coverage": 1.0}, {"max_risk": 0}, {"conformal_score": "topk", "coverage": 0.9},
                {"class_conditional": "yes", "coverage": 0.9}, {"conformal_score": "aps"},
                {"abstain_if_ood": False}):  # an option of what was not asked would be dropped
        assert predict(running, **bad).status_code == 422, bad


def test_the_upload_route_takes_the_same_asks(server: tuple[Running, Path]) -> None:
    running, _ = server
    image = png_base64(np.zeros((28, 28), dtype=np.uint8))
    files = {"file": ("x.png", base64.b64decode(image), "image/png")}
    response = httpx.post(f"{running.url}/predict/image", files=files,
                          data={"coverage": "0.8", "max_risk": "0.3", "class_conditional": "true"}, timeout=60)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["decisions"]["class_conditional"] is True and body["decisions"]["coverage"] == 0.8
    assert isinstance(body["predictions"][0]["set_size"], int) and isinstance(body["predictions"][0]["abstain"], bool)
    alone = httpx.post(f"{running.url}/predict/image", files=files, data={"class_conditional": "true"}, timeout=60)
    assert alone.status_code == 422 and "give coverage too" in alone.json()["error"]
