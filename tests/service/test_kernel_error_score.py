"""Serving the kernel error: a version whose manifest names ``kernel_error`` (or a ``combined`` score using it) is
answered from the artifact's ``scored_rows`` over real HTTP, with the values the loaded file gives directly; a
manifest that needs it from an artifact without ``scored_rows``, or a combined score without terms, is unavailable
with the reason."""

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
from tests.repository_facts import WHOLE_STACK_DIRECTOR_DIR
from tests.service.conftest import (
    TEXT_MODEL,
    copy_version,
    random_pixels,
    rehash,
    serve,
    settings_for,
)


def variant(source: Path, work: Path, name: str, ood: dict[str, Any]) -> Path:
    """A copy of ``source`` whose manifest's ``ood`` section is updated with ``ood`` (a None value removes the key),
    re-hashed."""
    target = work / name
    shutil.copytree(source, target)
    manifest = json.loads((target / MANIFEST).read_text())
    manifest["ood"].update(ood)
    manifest["ood"] = {k: v for k, v in manifest["ood"].items() if v is not None}
    rehash(target, manifest)
    return target


def kernel_errors(folder: Path, *inputs: torch.Tensor) -> torch.Tensor:
    """The kernel error [B] the artifact file itself computes (the first column of its per-input scores; a committed
    artifact from before the feature scores returns it alone, [B])."""
    module = torch.jit.load(str(folder / ARTIFACT)).eval()
    with torch.inference_mode():
        scores = module.scored_rows(*inputs, torch.ones(inputs[0].shape[0], dtype=torch.long))[1]
    return scores[:, 0] if scores.dim() == 2 else scores


def rules(score: str, threshold: float) -> dict[str, Any]:
    return {"score": score, "fallback_score": score,
            "thresholds": {str(s): {"score": score, "threshold": threshold} for s in (1, 2, 4)}}


def test_image_kernel_error_and_combined_scores_over_http(tiny_artifact: Path, tmp_path: Path) -> None:
    pixels = random_pixels(np.random.default_rng(3), 4)
    errors = kernel_errors(tiny_artifact, torch.tensor(pixels, dtype=torch.float32))  # [4]
    ordered = errors.sort().values  # [3]
    threshold = float(ordered[:2].mean())  # halfway between two scores: no served score sits on it
    center = float(errors.log().mean())
    terms = [{"score": "kernel_error", "weight": 0.75, "center": center, "scale": 0.5, "log": True},
             {"score": "max_softmax", "weight": 0.25, "center": 0.1, "scale": 0.2, "log": False}]
    repository = tmp_path / "repo"
    copy_version(variant(tiny_artifact, tmp_path, "error", rules("kernel_error", threshold)), repository, "tiny", "1")
    copy_version(variant(tiny_artifact, tmp_path, "combined", {**rules("combined", 0.0), "combination": terms}),
                 repository, "tiny", "2")
    no_terms = variant(tiny_artifact, tmp_path, "no-terms", {**rules("combined", 0.0), "combination": None})
    copy_version(no_terms, repository, "tiny", "3")
    whole_stack = variant(WHOLE_STACK_DIRECTOR_DIR, tmp_path, "old", rules("kernel_error", 0.01))
    copy_version(whole_stack, repository, "old", "1")
    with serve(settings_for(repository, tmp_path, required_models=[])) as running:
        body = {"inputs": [{"pixels": p} for p in pixels], "n_samples": 2}
        plain = httpx.post(f"{running.url}/predict", json={**body, "version": "1"}, timeout=60)
        assert plain.status_code == 200, plain.text
        predictions = plain.json()["predictions"]
        served = torch.tensor([p["ood_score"] for p in predictions])
        torch.testing.assert_close(served, errors.double().float(), rtol=1e-4, atol=1e-9)
        assert [p["is_ood"] for p in predictions] == [e > threshold for e in errors.tolist()]
        assert plain.json()["ood"]["score"] == "kernel_error"

        combined = httpx.post(f"{running.url}/predict", json={**body, "version": "2"}, timeout=60)
        assert combined.status_code == 200, combined.text
        for p, error in zip(combined.json()["predictions"], errors.tolist(), strict=True):
            expected = 0.75 * (math.log(error) - center) / 0.5 + 0.25 * ((1 - p["confidence"]) - 0.1) / 0.2
            assert abs(p["ood_score"] - expected) < 1e-3 and p["is_ood"] == (p["ood_score"] > 0.0)

        versions = {v["version"]: v for v in httpx.get(f"{running.url}/models/tiny", timeout=30).json()["versions"]}
        assert versions["3"]["state"] == "unavailable" and "ood.combination" in versions["3"]["reason"]
        old = httpx.get(f"{running.url}/models/old", timeout=30).json()["versions"][0]
        assert old["state"] == "unavailable" and "no scored_rows" in old["reason"]


def test_text_kernel_error_over_http_and_the_open_inference_protocol(tiny_text_artifact: Path, tmp_path: Path
                                                                      ) -> None:
    from tokenizers import Tokenizer

    texts = ["a warm and funny film", "the plot is a mess and the actors look bored", "zzz qqq"]
    tokenizer = Tokenizer.from_file(str(tiny_text_artifact / "tokenizer.json"))
    tokenizer.no_padding()
    encoded = [tokenizer.encode(t).ids for t in texts]
    width = max(map(len, encoded))
    ids = torch.tensor([row + [0] * (width - len(row)) for row in encoded])  # [3, L] right-padded
    mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in encoded])  # [3, L]
    errors = kernel_errors(tiny_text_artifact, ids, mask)  # [3]
    repository = tmp_path / "repo"
    ordered = errors.sort().values  # [3]
    threshold = float(ordered[:2].mean())  # halfway between two scores: no served score sits on it
    copy_version(variant(tiny_text_artifact, tmp_path, "error", rules("kernel_error", threshold)), repository,
                 TEXT_MODEL, "1")
    with serve(settings_for(repository, tmp_path, default_model=TEXT_MODEL)) as running:
        response = httpx.post(f"{running.url}/predict", json={"inputs": [{"text": t} for t in texts],
                                                              "n_samples": 4}, timeout=60)
        assert response.status_code == 200, response.text
        served = torch.tensor([p["ood_score"] for p in response.json()["predictions"]])
        torch.testing.assert_close(served, errors.float(), rtol=1e-4, atol=1e-9)
        oip = httpx.post(f"{running.url}/v2/models/{TEXT_MODEL}/infer", timeout=60, json={
            "inputs": [{"name": "text", "datatype": "BYTES", "shape": [3], "data": texts}],
            "parameters": {"n_samples": 1}})
        assert oip.status_code == 200, oip.text
        outputs = {o["name"]: o["data"] for o in oip.json()["outputs"]}
        torch.testing.assert_close(torch.tensor(outputs["ood_score"]), errors.float(), rtol=1e-4, atol=1e-9)
        assert outputs["is_ood"] == [e > threshold for e in errors.tolist()]


def test_a_feature_score_is_served_from_its_column(tiny_artifact: Path, tmp_path: Path) -> None:
    """``ood.score: mds`` reads the column ``artifact.input_scores`` names for it; an artifact whose scores lack the
    rule's score is refused with the reason."""
    pixels = random_pixels(np.random.default_rng(4), 4)
    module = torch.jit.load(str(tiny_artifact / ARTIFACT)).eval()
    with torch.inference_mode():
        scores = module.scored_rows(torch.tensor(pixels, dtype=torch.float32), torch.ones(4, dtype=torch.long))[1]
    names = json.loads((tiny_artifact / MANIFEST).read_text())["artifact"]["input_scores"]
    mds = scores[:, names.index("mds")]  # [4]
    repository = tmp_path / "repo"
    copy_version(variant(tiny_artifact, tmp_path, "mds", rules("mds", float(mds.median()))), repository, "tiny", "1")
    lacking = variant(tiny_artifact, tmp_path, "lacking", rules("knn", 0.5))
    manifest = json.loads((lacking / MANIFEST).read_text())
    manifest["artifact"]["input_scores"] = ["kernel_error"]
    rehash(lacking, manifest)
    copy_version(lacking, repository, "lacking", "1")
    with serve(settings_for(repository, tmp_path, required_models=[])) as running:
        response = httpx.post(f"{running.url}/predict", timeout=60,
                              json={"inputs": [{"pixels": p} for p in pixels], "n_samples": 1})
        assert response.status_code == 200, response.text
        served = torch.tensor([p["ood_score"] for p in response.json()["predictions"]])
        torch.testing.assert_close(served, mds.float(), rtol=1e-4, atol=1e-6)
        assert response.json()["ood"]["score"] == "mds"
        lacking_state = httpx.get(f"{running.url}/models/lacking", timeout=30).json()["versions"][0]
        assert lacking_state["state"] == "unavailable" and "does not return" in lacking_state["reason"]
