"""The committed vision models served side by side over real HTTP, as `make serve` serves them: fashion-vit v9 (v8
exported again with a calibration split carved from validation, so it answers prediction sets and abstentions; the
default version), v8 (the post-hoc path the kernel's verdict chose: the backbone's own forward with the Mahalanobis
score and the temperature that follows it), v7 (v6 re-exported keeping only the score it reads), v6
(v4's sampling at S = 1 with a temperature per input that grows with its Mahalanobis score), v5
(v4's weights with the sampled noise shaped on a held-out shift and S = 16 by default), v4
(partial-depth DIRECTOR with the backbone's last transition and the feature-space statistics, scored by the
Mahalanobis distance), v3 (the same weights, the kernel error among its candidates), v2 (scored by energy) and v1
(whole-stack), kept for rollback, and the deterministic backbone baseline. Held-out Fashion-MNIST
images get their labels from each, the default version is the newest, test images are flagged OOD at about the rate
the threshold was set for, and the artifacts stay small."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.repository_facts import default_version
from tests.service.conftest import (
    REPO_ROOT,
    Running,
    copy_version,
    flagged_share,
    png_base64,
    relative_ood_counts,
    separates_by_relative_score,
    serve,
    settings_for,
)

VISION_MODEL = REPO_ROOT / "model_repository" / "fashion-vit"
BASELINE = REPO_ROOT / "model_repository" / "fashion-vit-deterministic"
FOLDERS = {**{("fashion-vit", v): VISION_MODEL / v for v in ("1", "2", "3", "4", "5", "6", "7", "8", "9")},
           **{("fashion-vit-deterministic", v): BASELINE / v for v in ("1", "2")}}
DEFAULT_VERSION = default_version("fashion-vit")  # the highest published version
DEFAULT_BASELINE = "2"
BUDGET_MIB = 5
FEATURE_BANK_MIB = 4  # v4-v6 carry the KNN bank: 10,000 training features x 96 floats (3.7 MiB) beside the model


@pytest.fixture(scope="module")
def vision_models(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    assert ("fashion-vit", DEFAULT_VERSION) in FOLDERS, f"fashion-vit {DEFAULT_VERSION} is published: add it to FOLDERS"
    tmp = tmp_path_factory.mktemp("vision-models")
    for (name, version), folder in FOLDERS.items():
        assert (folder / "manifest.json").is_file(), f"a committed vision model is missing: {folder}"
        copy_version(folder, tmp / "repo", name, version)
    with serve(settings_for(tmp / "repo", tmp, default_model="fashion-vit")) as running:
        yield running


def held_out(n: int) -> tuple[np.ndarray, list[int]]:
    from training.data.images import load_fashion_mnist_split

    test = load_fashion_mnist_split("/usr/share/datasets/fashion-mnist", "test")
    return (test.images[:n, 0].numpy() * 255).round().astype(np.uint8), test.labels[:n].tolist()


def predict(server: Running, images: np.ndarray, seed: int, model: str = "fashion-vit") -> dict:
    body = {"model": model, "inputs": [{"image_base64": png_base64(img)} for img in images], "seed": seed}
    response = httpx.post(f"{server.url}/predict", json=body, timeout=300)
    assert response.status_code == 200, response.text
    return response.json()


def test_every_version_is_ready_and_the_newest_is_the_default(vision_models: Running) -> None:
    models = {m["name"]: m for m in httpx.get(f"{vision_models.url}/models", timeout=10).json()["models"]}
    assert {"fashion-vit", "fashion-vit-deterministic"} <= set(models)
    assert all(v["state"] == "ready" for m in models.values() for v in m["versions"])
    images, _ = held_out(1)
    assert predict(vision_models, images, seed=0)["model_version"] == DEFAULT_VERSION


def test_the_served_mahalanobis_score_is_the_artifacts_own(vision_models: Running) -> None:
    """The default version serves ``mds``: the column ``artifact.input_scores`` names in the file's ``scored_rows``."""
    import torch

    folder = VISION_MODEL / DEFAULT_VERSION
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["ood"]["score"] == "mds"
    images, _ = held_out(8)
    pixels = torch.tensor(images, dtype=torch.float32).unsqueeze(1) / 255.0  # [8, 1, 28, 28] as the PNGs decode
    with torch.inference_mode():
        scores = torch.jit.load(str(folder / "director.ts")).scored_rows(pixels, torch.ones(8, dtype=torch.long))[1]
    expected = scores[:, manifest["artifact"]["input_scores"].index("mds")]
    served = torch.tensor([p["ood_score"] for p in predict(vision_models, images, seed=0)["predictions"]])
    torch.testing.assert_close(served, expected, rtol=1e-4, atol=1e-3)


def test_a_re_export_keeping_only_the_served_score_serves_what_v6_serves(vision_models: Running) -> None:
    """v7 is v6 exported again: only the score its manifest reads (``mds``) left in ``scored_rows``, the stem's batch
    norms folded. Over HTTP, under one seed, it answers as v6 does (probabilities and OOD score to float32
    rounding: the folded stem rounds differently), as the deterministic baseline's version 2 answers as version 1."""
    manifests = {v: json.loads((VISION_MODEL / v / "manifest.json").read_text()) for v in ("6", "7")}
    assert manifests["6"]["artifact"]["input_scores"] == ["kernel_error", "mds", "rmds", "knn", "vim"]
    assert manifests["7"]["artifact"]["input_scores"] == ["kernel_error", "mds"]
    images, _ = held_out(16)
    for model, old, new in (("fashion-vit", "6", "7"), ("fashion-vit-deterministic", "1", "2")):
        answers = {}
        for version in (old, new):
            body = {"model": model, "version": version, "seed": 3,
                    "inputs": [{"image_base64": png_base64(img)} for img in images]}
            response = httpx.post(f"{vision_models.url}/predict", json=body, timeout=300)
            assert response.status_code == 200, response.text
            answers[version] = response.json()["predictions"]
        for a, b in zip(answers[old], answers[new], strict=True):
            assert a["label"] == b["label"]
            assert b["ood_score"] == pytest.approx(a["ood_score"], rel=1e-3, abs=1e-3)
            for label, p in a["probabilities"].items():
                assert b["probabilities"][label] == pytest.approx(p, abs=1e-4)


def test_the_default_serves_the_posthoc_path_the_verdict_chose(vision_models: Running) -> None:
    """The default serves the backbone's own forward: the labels of the deterministic baseline (the same backbone),
    every sample the same row (mutual information 0 at S = 4), and the verdict's sentence in ``GET /models``."""
    manifest = json.loads((VISION_MODEL / DEFAULT_VERSION / "manifest.json").read_text())
    assert manifest["method"] == "posthoc" and manifest["kernel_verdict"]["served"] == "posthoc"
    models = {m["name"]: m for m in httpx.get(f"{vision_models.url}/models", timeout=10).json()["models"]}
    served = next(v for v in models["fashion-vit"]["versions"] if v["version"] == DEFAULT_VERSION)
    assert served["kernel_verdict"] == manifest["kernel_verdict"]["sentence"]
    images, _ = held_out(32)
    body = {"inputs": [{"image_base64": png_base64(img)} for img in images]}
    answers = {}
    for model, samples in (("fashion-vit", 4), ("fashion-vit-deterministic", 1)):
        response = httpx.post(f"{vision_models.url}/predict", json={**body, "model": model, "n_samples": samples},
                              timeout=300)
        assert response.status_code == 200, response.text
        answers[model] = response.json()["predictions"]
    for posthoc, backbone in zip(answers["fashion-vit"], answers["fashion-vit-deterministic"], strict=True):
        assert posthoc["label"] == backbone["label"]
        assert posthoc["mutual_information"] == pytest.approx(0.0, abs=1e-6)


def test_the_default_answers_prediction_sets_and_abstentions(vision_models: Running) -> None:
    """Calibrated on its own calibration split: held-out test images' 90% sets hold their labels about 90% of the
    time (200 images: a binomial standard error of about 2 points), and max_risk 0.05 answers most of them."""
    images, labels = held_out(200)
    body = {"inputs": [{"image_base64": png_base64(img)} for img in images], "coverage": 0.9, "max_risk": 0.05}
    response = httpx.post(f"{vision_models.url}/predict", json=body, timeout=300)
    assert response.status_code == 200, response.text
    answer = response.json()
    names = json.loads((VISION_MODEL / DEFAULT_VERSION / "manifest.json").read_text())["labels"]
    covered = [names[y] in p["prediction_set"] for p, y in zip(answer["predictions"], labels, strict=True)]
    assert 0.84 <= sum(covered) / len(covered) <= 1.0
    assert all(p["set_size"] == len(p["prediction_set"]) for p in answer["predictions"])
    assert sum(p["set_size"] for p in answer["predictions"]) / len(covered) < 1.5  # LAC: mostly the one label
    rules = answer["decisions"]
    assert rules["coverage"] == 0.9 and rules["conformal_score"] == "lac" and rules["risk_level"] == 0.05
    answered = [p for p in answer["predictions"] if not p["abstain"]]
    assert len(answered) > 100 and all(p["confidence"] >= rules["confidence_threshold"] for p in answered)


@pytest.mark.parametrize("folder", sorted(FOLDERS.values(), key=str), ids=lambda p: f"{p.parent.name}-{p.name}")
def test_artifact_size_budget(folder: Path) -> None:
    total = sum(p.stat().st_size for p in folder.iterdir() if p.is_file())
    budget = BUDGET_MIB + (FEATURE_BANK_MIB if folder in (VISION_MODEL / "4", VISION_MODEL / "5", VISION_MODEL / "6")
                           else 0)
    assert total < budget * 2**20, f"{total / 2**20:.1f} MiB"


@pytest.mark.parametrize("model", ["fashion-vit", "fashion-vit-deterministic"])
def test_held_out_images_get_their_labels(vision_models: Running, model: str) -> None:
    images, labels = held_out(200)
    folder = FOLDERS[(model, DEFAULT_VERSION if model == "fashion-vit" else DEFAULT_BASELINE)]
    manifest = json.loads((folder / "manifest.json").read_text())
    predictions = [p for start in range(0, 200, 50)
                   for p in predict(vision_models, images[start : start + 50], seed=start, model=model)["predictions"]]
    accuracy = sum(p["label"] == manifest["labels"][y] for p, y in zip(predictions, labels, strict=True)) / 200
    assert accuracy >= 0.85, accuracy  # the manifests' test accuracy is ~0.90 on all 10,000
    for p in predictions:
        assert p["confidence"] == pytest.approx(max(p["probabilities"].values()))
        assert p["mutual_information"] >= 0.0


def test_ood_flag_rate_on_test_images_is_what_the_threshold_was_set_for(vision_models: Running) -> None:
    """The threshold passes 95% of in-distribution validation inputs, so test images are flagged at about 5%."""
    manifest = json.loads((VISION_MODEL / DEFAULT_VERSION / "manifest.json").read_text())
    images, _ = held_out(200)
    responses = [predict(vision_models, images[start : start + 50], start) for start in range(0, 200, 50)]
    rate = flagged_share(manifest, responses)
    assert rate <= 0.12, rate  # 5% expected; 12% is far outside 200 draws' sampling error


def test_the_relative_ood_score_histogram_separates_id_from_ood_traffic(vision_models: Running) -> None:
    """The default's Mahalanobis scores run from ~30 to several hundred: every observation of the raw score landed in
    +Inf. Relative to the threshold, test images and uniform noise fill finite buckets, and different ones."""
    images, _ = held_out(64)
    noise = (np.random.default_rng(0).random((64, 28, 28)) * 255).astype(np.uint8)
    counts = [relative_ood_counts(vision_models.url, "fashion-vit", DEFAULT_VERSION)]
    for batch in (images, noise):
        for start in range(0, 64, 32):
            predict(vision_models, batch[start:start + 32], seed=start)
        counts.append(relative_ood_counts(vision_models.url, "fashion-vit", DEFAULT_VERSION))
    id_inf, ood_inf, id_median, ood_median = separates_by_relative_score(*counts)
    assert id_inf < 0.1 and ood_inf < 0.1, (id_inf, ood_inf)
    assert id_median <= 1.0 < ood_median, (id_median, ood_median)
