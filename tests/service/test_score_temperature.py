"""A temperature per input (``temperature_by_score``): the server divides each input's sampled logits by
``temperature * exp(slope * max(0, z))``, z read from the artifact's ``scored_rows`` scores, over real HTTP and the
Open Inference Protocol; the answers equal the loaded file's logits summarised that way. A term that is not a
per-input score, or one the artifact does not return, makes the version unavailable with the reason."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import torch

from artifact.contract import ARTIFACT, MANIFEST
from models.uncertainty import ScoreTemperature, ScoreTerm, summarize
from tests.service.conftest import copy_version, random_pixels, rehash, serve, settings_for

SLOPE = 0.8
BASE = 1.3


def with_score_temperature(source: Path, work: Path, name: str, by_score: dict[str, Any],
                           input_scores: list[str] | None = None) -> Path:
    """A copy of ``source`` with ``temperature_by_score`` (and the temperature ``BASE``), re-hashed."""
    target = work / name
    shutil.copytree(source, target)
    manifest = json.loads((target / MANIFEST).read_text())
    manifest["temperature"] = BASE
    manifest["temperature_by_score"] = by_score
    if input_scores is not None:
        manifest["artifact"]["input_scores"] = input_scores
    rehash(target, manifest)
    return target


def test_each_input_is_divided_by_its_own_temperature(tiny_artifact: Path, tmp_path: Path) -> None:
    pixels = random_pixels(np.random.default_rng(11), 6)
    inputs = torch.tensor(pixels, dtype=torch.float32)  # [6, C, H, W]
    module = torch.jit.load(str(tiny_artifact / ARTIFACT)).eval()
    names = json.loads((tiny_artifact / MANIFEST).read_text())["artifact"]["input_scores"]
    torch.manual_seed(0)
    with torch.inference_mode():
        scores = module.scored_rows(inputs, torch.ones(6, dtype=torch.long))[1]  # [6, F]
    errors = scores[:, names.index("kernel_error")]  # [6]
    center = float(errors.log().median())  # half the inputs above it: their temperature grows
    term = {"score": "kernel_error", "weight": 1.0, "center": center, "scale": float(errors.log().std()), "log": True}
    repository = tmp_path / "repo"
    copy_version(with_score_temperature(tiny_artifact, tmp_path, "by-score", {"slope": SLOPE, "terms": [term]}),
                 repository, "tiny", "1")
    copy_version(with_score_temperature(tiny_artifact, tmp_path, "logit-term",
                                        {"slope": SLOPE, "terms": [{**term, "score": "max_softmax", "log": False}]}),
                 repository, "tiny", "2")
    copy_version(with_score_temperature(tiny_artifact, tmp_path, "missing", {"slope": SLOPE, "terms": [term]},
                                        input_scores=["mds"]), repository, "tiny", "3")
    expected_t = ScoreTemperature(BASE, SLOPE, (ScoreTerm(**term),))({"kernel_error": errors})  # [6]
    # the request holds inputs at the base temperature and inputs above it
    assert math.isclose(float(expected_t.min()), BASE, rel_tol=1e-6) and float(expected_t.max()) > BASE * 1.1
    with serve(settings_for(repository, tmp_path, required_models=[])) as running:
        body = {"version": "1", "inputs": [{"pixels": p} for p in pixels], "n_samples": 4, "seed": 5,
                "return_probabilities": True}
        response = httpx.post(f"{running.url}/predict", json=body, timeout=60)
        assert response.status_code == 200, response.text
        torch.manual_seed(5)
        with torch.inference_mode():
            rows, _ = module.scored_rows(inputs, torch.full((6,), 4, dtype=torch.long))  # [24, C]
        expected = summarize(rows.view(6, 4, -1).transpose(0, 1), expected_t)  # [4, 6, C] -> [6]
        served = response.json()["predictions"]
        probabilities = torch.tensor([list(p["probabilities"].values()) for p in served])  # [6, C]
        torch.testing.assert_close(probabilities, expected.probabilities, rtol=1e-4, atol=1e-5)
        one = summarize(rows.view(6, 4, -1).transpose(0, 1), BASE)  # every input at the base temperature
        hot = expected_t > BASE * (1 + 1e-6)
        assert torch.all(expected.confidence[hot] < one.confidence[hot])  # softer where the score is high
        torch.testing.assert_close(expected.probabilities[~hot], one.probabilities[~hot])
        confidence = torch.tensor([p["confidence"] for p in served])  # [6]
        torch.testing.assert_close(confidence, expected.confidence, rtol=1e-4, atol=1e-5)

        oip = httpx.post(f"{running.url}/v2/models/tiny/versions/1/infer", timeout=60, json={
            "inputs": [{"name": "pixels", "datatype": "FP32", "shape": list(inputs.shape),
                        "data": inputs.flatten().tolist()}],
            "parameters": {"n_samples": 4, "seed": 5}})
        assert oip.status_code == 200, oip.text
        outputs = {o["name"]: o["data"] for o in oip.json()["outputs"]}
        torch.testing.assert_close(torch.tensor(outputs["confidence"]), expected.confidence, rtol=1e-4, atol=1e-5)

        config = httpx.get(f"{running.url}/v2/models/tiny/versions/1/config", timeout=30).json()
        assert float(config["parameters"]["temperature_slope"]["string_value"]) == SLOPE
        versions = {v["version"]: v for v in httpx.get(f"{running.url}/models/tiny", timeout=30).json()["versions"]}
        assert versions["1"]["state"] == "ready"
        assert versions["2"]["state"] == "unavailable" and "temperature_by_score term" in versions["2"]["reason"]
        assert versions["3"]["state"] == "unavailable" and "does not return" in versions["3"]["reason"]
