"""The committed text model (model_repository/movie-reviews-minilm/1/) served beside the vision model over real
HTTP, as `make serve` serves them: real held-out movie-review sentences get the right sentiment, reviews are flagged OOD
at the rate the threshold was set for, and the artifact stays under its size budget."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.service.conftest import DEFAULT_MODEL_DIR, REPO_ROOT, Running, copy_version, serve, settings_for

TEXT_MODEL_DIR = REPO_ROOT / "model_repository" / "movie-reviews-minilm" / "1"


@pytest.fixture(scope="module")
def both_models(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    assert (TEXT_MODEL_DIR / "manifest.json").is_file(), f"the text model is missing: {TEXT_MODEL_DIR}"
    tmp = tmp_path_factory.mktemp("default-text-model")
    copy_version(DEFAULT_MODEL_DIR, tmp / "repo", "fashion-vit", "1")
    copy_version(TEXT_MODEL_DIR, tmp / "repo", "movie-reviews-minilm", "1")
    with serve(settings_for(tmp / "repo", tmp, default_model="fashion-vit")) as running:
        yield running


def predict(server: Running, texts: list[str], seed: int) -> list[dict]:
    body = {"model": "movie-reviews-minilm", "inputs": [{"text": t} for t in texts], "seed": seed}
    response = httpx.post(f"{server.url}/predict", json=body, timeout=300)
    assert response.status_code == 200, response.text
    return response.json()["predictions"]


def test_both_committed_models_are_ready_side_by_side(both_models: Running) -> None:
    models = {m["name"]: m for m in httpx.get(f"{both_models.url}/models", timeout=10).json()["models"]}
    assert {"fashion-vit", "movie-reviews-minilm"} <= set(models)
    assert all(m["versions"][0]["state"] == "ready" for m in models.values())
    assert httpx.get(f"{both_models.url}/health/ready", timeout=10).status_code == 200


def test_artifact_size_budget() -> None:
    total = sum(p.stat().st_size for p in TEXT_MODEL_DIR.iterdir() if p.is_file())
    assert total < 25 * 2**20, f"{total / 2**20:.1f} MiB"


def test_held_out_reviews_get_their_sentiment(both_models: Running) -> None:
    from training.text_data import load_movie_reviews

    test = load_movie_reviews(val_size=1000, split_seed=0).test.head(120)  # the model's own held-out split
    predictions = [p for start in range(0, 120, 40)
                   for p in predict(both_models, test.texts[start : start + 40], seed=start)]
    labels = ["negative", "positive"]
    accuracy = sum(p["label"] == labels[y] for p, y in zip(predictions, test.labels.tolist(), strict=True)) / 120
    assert accuracy >= 0.8, accuracy  # the manifest's test accuracy is ~0.87 on all 2,000
    for p in predictions:
        assert p["confidence"] == pytest.approx(max(p["probabilities"].values()))
        assert p["mutual_information"] >= 0.0


def test_ood_flag_rate_on_reviews_is_what_the_threshold_was_set_for(both_models: Running) -> None:
    """The threshold passes 95% of in-distribution validation inputs, so held-out reviews are flagged at about 5%.
    (Fortunes quotes are flagged barely more often, 6.4% vs 4.5% at export: this model's OOD detection of other
    English text is weak, as docs/results/movie-reviews.md reports; that is a finding, not tested as a property.)"""
    import json

    from training.text_data import load_movie_reviews

    manifest = json.loads((TEXT_MODEL_DIR / "manifest.json").read_text())
    reviews = load_movie_reviews(val_size=1000, split_seed=0).test.texts[:200]
    predictions = [p for start in range(0, 200, 50) for p in predict(both_models, reviews[start : start + 50], start)]
    threshold = manifest["ood"]["thresholds"]["16"]["threshold"]
    assert all(p["is_ood"] == (p["ood_score"] > threshold) for p in predictions)
    rate = sum(p["is_ood"] for p in predictions) / len(predictions)
    assert rate <= 0.12, rate  # 5% expected; 12% is far outside 200 draws' sampling error
