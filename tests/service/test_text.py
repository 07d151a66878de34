"""Text models over real HTTP: every field, truncation reported, limits, the other modality refused, right padding that
changes nothing (noise off: identical; noise on: the same distribution), mixed sample counts in one forward, seeds,
metrics, drift and feedback, and the input section in /models.

The tiny text artifact (``tests.conftest.tiny_text_config_dict``): max_length 32 tokens, max_characters 200, labels
negative / positive, default 4 samples, at most 8; ``tiny-text-quiet`` is the same artifact with its noise off."""

from __future__ import annotations

import asyncio
import math
import statistics
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import pytest
from tokenizers import Tokenizer

from tests.service.conftest import (
    QUIET_MODEL,
    TEXT_MODEL,
    Running,
    metric_value,
    one_batch,
    png_base64,
    random_pixels,
)

SHORT = "a funny film."  # 6 tokens with [CLS] and [SEP]: padded to 8 alone
MEDIUM = "the acting is good but the story is not."  # 13 tokens: padded to 16
LONG = [  # 40 to 59 tokens each: truncated to 32, so a batch holding one is padded to 32
    "the plot wanders for an hour before anything happens, and by then the characters have stopped mattering to me",
    "one of the warmest and most quietly moving stories of the year, with two performances that stay with you long "
    "after the credits",
    "an overlong, tedious mess whose jokes fall flat, whose twists are obvious, and whose ending "
    "made the whole audience groan at once",
]


@pytest.fixture(scope="module")
def count(text_repository: Path) -> Callable[[str], int]:
    """Tokens of a text, untruncated, [CLS] and [SEP] included (the tiny vocabulary splits many words)."""
    tokenizer = Tokenizer.from_file(str(text_repository / TEXT_MODEL / "1" / "tokenizer.json"))
    tokenizer.no_truncation()
    return lambda text: len(tokenizer.encode(text).ids)


def test_the_texts_have_the_lengths_the_tests_assume(count: Callable[[str], int]) -> None:
    assert count(SHORT) <= 8 and 8 < count(MEDIUM) <= 16 and all(count(text) > 32 for text in LONG)
    assert all(len(text) <= 200 for text in LONG)


def post(server: Running, body: dict, status: int = 200) -> dict:
    response = httpx.post(f"{server.url}/predict", json=body, timeout=60)
    assert response.status_code == status, response.text
    return response.json()


def probabilities(prediction: dict) -> np.ndarray:
    return np.array([prediction["probabilities"][label] for label in ("negative", "positive")])


def test_text_prediction_returns_every_field(text_server: Running, count: Callable[[str], int]) -> None:
    out = post(text_server, {"inputs": [{"text": SHORT}, {"text": MEDIUM}], "n_samples": 4})
    assert out["model"] == TEXT_MODEL and out["model_version"] == "1" and out["n_samples"] == 4
    assert out["ood"]["calibrated_n_samples"] == 4
    assert out["timings"]["batch_padded_length"] == 16 and out["timings"]["batch_rows"] == 8
    for i, p in enumerate(out["predictions"]):
        assert p["index"] == i and p["label"] in ("negative", "positive")
        probs = p["probabilities"]
        assert math.isclose(sum(probs.values()), 1.0, abs_tol=1e-5) and p["confidence"] == max(probs.values())
        assert list(probs)[p["class_index"]] == p["label"]
        assert math.isclose(p["mutual_information"], max(0.0, p["predictive_entropy"] - p["expected_entropy"]),
                            abs_tol=1e-5)
        assert p["is_ood"] == (p["ood_score"] > out["ood"]["threshold"])
        assert p["truncated"] is False and p["dropped_tokens"] == 0
    assert [p["tokens"] for p in out["predictions"]] == [count(SHORT), count(MEDIUM)]


def test_image_responses_have_no_text_fields(text_server: Running) -> None:
    out = post(text_server, {"model": "tiny", "inputs": [{"pixels": random_pixels(np.random.default_rng(0))[0]}]})
    assert not {"tokens", "truncated", "dropped_tokens"} & set(out["predictions"][0])
    assert "batch_padded_length" not in out["timings"]


def test_truncation_is_reported(text_server: Running, count: Callable[[str], int]) -> None:
    text = "so bad it is good, " * 8  # 152 characters, more than 32 tokens
    total = count(text)
    assert total > 32 and len(text + " a masterpiece!") <= 200
    out = post(text_server, {"inputs": [{"text": text}, {"text": SHORT}], "n_samples": 2})
    long, short = out["predictions"]
    assert long["truncated"] is True and long["tokens"] == 32 and long["dropped_tokens"] == total - 32
    assert short["truncated"] is False and short["tokens"] == count(SHORT) and short["dropped_tokens"] == 0
    # truncation keeps the first 32 tokens: a text that only differs after them gets the same answer (noise off)
    quiet = post(text_server, {"model": QUIET_MODEL, "inputs": [{"text": text}, {"text": text + " a masterpiece!"}]})
    np.testing.assert_allclose(probabilities(quiet["predictions"][0]), probabilities(quiet["predictions"][1]),
                               atol=1e-6)


def test_text_limits_and_modality_errors(text_server: Running) -> None:
    assert post(text_server, {"inputs": [{"text": "a" * 199 + "!"}]})["predictions"][0]["truncated"] is False
    over = post(text_server, {"inputs": [{"text": SHORT}, {"text": "x" * 201}]}, 413)
    assert "201 characters" in over["error"] and "200" in over["error"]
    for empty in ("", "   \n\t"):
        error = post(text_server, {"inputs": [{"text": empty}]}, 422)
        assert "empty" in error["error"] and error["details"][0]["loc"] == ["body", "inputs", 0, "text"]
    pixels = random_pixels(np.random.default_rng(1))[0]
    for image_input in ({"pixels": pixels}, {"image_base64": png_base64(np.zeros((28, 28), np.uint8))}):
        error = post(text_server, {"inputs": [{"text": SHORT}, image_input]}, 422)
        assert "takes text" in error["error"] and "image model" in error["error"]
    error = post(text_server, {"model": "tiny", "inputs": [{"text": SHORT}]}, 422)
    assert "takes images" in error["error"] and "text model" in error["error"]
    upload = httpx.post(f"{text_server.url}/predict/image", data={"model": TEXT_MODEL}, timeout=30,
                        files={"file": ("x.png", b"\x89PNG not read", "image/png")})
    assert upload.status_code == 422 and "takes text" in upload.json()["error"]
    assert post(text_server, {"inputs": [{"text": SHORT}], "n_samples": 9}, 422)["details"][0]["loc"] == [
        "body", "n_samples"]


def test_models_show_the_text_input_section(text_server: Running) -> None:
    listing = httpx.get(f"{text_server.url}/models", timeout=30).json()
    assert listing["default_model"] == TEXT_MODEL
    versions = {m["name"]: m["versions"][0] for m in listing["models"]}
    text = versions[TEXT_MODEL]
    assert text["state"] == "ready" and text["modality"] == "text" and text["max_text_characters"] == 200
    section = text["input"]
    assert section["tokenizer"] == "tokenizer.json" and section["max_length"] == 32
    assert section["max_characters"] == 200 and section["padding"]["side"] == "right"
    assert isinstance(section["padding"]["pad_id"], int)
    assert versions["tiny"]["input"]["height"] == 28 and versions["tiny"]["max_text_characters"] is None
    broken = versions["broken-text"]
    assert broken["state"] == "unavailable" and "tokenizer.json" in broken["reason"]
    overlong = versions["overlong-text"]
    assert overlong["state"] == "unavailable" and "warm-up forward failed" in overlong["reason"]
    assert "max_length" in overlong["reason"] and "\n" not in overlong["reason"]  # the error, not its traceback
    for name, listed in (("broken-text", broken), ("overlong-text", overlong)):  # why, not "wait": it will not load
        error = post(text_server, {"model": name, "inputs": [{"text": SHORT}]}, 503)["error"]
        assert error == f"model '{name}' version 1 is unavailable: {listed['reason']}"
    detail = httpx.get(f"{text_server.url}/models/{TEXT_MODEL}", timeout=30).json()
    assert detail["manifest"]["modality"] == "text" and "tokenizer.json" in detail["manifest"]["files"]
    assert httpx.get(f"{text_server.url}/health/ready", timeout=30).status_code == 200  # none is required


def test_padding_changes_nothing_with_the_noise_off(text_server: Running) -> None:
    """``tiny-text-quiet`` has its sampling noise off: a text's probabilities are the same (1e-5) alone (padded to 8),
    beside longer texts in its request, batched with other clients' longer texts, and in a request split into two
    forwards by the token budget."""
    base = {"model": QUIET_MODEL, "n_samples": 4}
    alone = post(text_server, {**base, "inputs": [{"text": SHORT}]})
    assert alone["timings"]["batch_padded_length"] == 8
    expected = probabilities(alone["predictions"][0])
    assert alone["predictions"][0]["mutual_information"] < 1e-6  # no noise: every sample is the same

    beside = post(text_server, {**base, "inputs": [{"text": LONG[0]}, {"text": SHORT}, {"text": LONG[1]}]})
    assert beside["timings"]["batch_padded_length"] == 32
    np.testing.assert_allclose(probabilities(beside["predictions"][1]), expected, atol=1e-5)

    bodies = [{"inputs": [{"text": SHORT}], "n_samples": 4}] * 3 + [
        {"inputs": [{"text": text}], "n_samples": 8} for text in LONG]
    batched = one_batch(text_server, QUIET_MODEL, bodies)
    for response in batched[:3]:
        out = response.json()
        assert out["timings"]["batch_requests"] == len(bodies) and out["timings"]["batch_padded_length"] == 32
        np.testing.assert_allclose(probabilities(out["predictions"][0]), expected, atol=1e-5)

    # 17 inputs x 8 samples x 32 tokens = 4352 > the 4096 budget: two parts (16 inputs, then 1), the short text in
    # the first, padded to its part's 32 tokens; the timings give the larger part's rows
    split = post(text_server, {**base, "n_samples": 8, "inputs": [{"text": SHORT}] + [{"text": LONG[2]}] * 16})
    assert split["timings"]["batch_rows"] == 16 * 8 and split["timings"]["batch_padded_length"] == 32
    np.testing.assert_allclose(probabilities(split["predictions"][0]), expected, atol=1e-5)
    text = httpx.get(f"{text_server.url}/metrics").text
    assert (metric_value(text, "director_batch_tokens_sum", model=QUIET_MODEL, version="1") or 0) >= 17 * 8 * 32


def test_padding_keeps_the_sampled_distribution(text_server: Running) -> None:
    """With noise (``tiny-text`` as exported), unseeded: 128 draws of a short text's 8-sample mean sent alone (padded
    to 8) against 128 sent beside a longer text (padded to 32), from concurrent clients. Padding changes nothing iff
    both are draws of the same distribution; their means (of p(positive) and of the mutual information) must agree
    within 5 standard errors of the difference (a false alarm about once in 1.7 million runs under normality). A
    padding bug moves p(positive) of this model by about 0.05, hundreds of standard errors."""
    rounds, per_request = 16, 8
    body = {"inputs": [{"text": SHORT}] * per_request, "n_samples": 8}
    alone = [post(text_server, body) for _ in range(rounds)]
    assert {out["timings"]["batch_padded_length"] for out in alone} == {8}

    async def concurrent() -> list[httpx.Response]:
        padded = {"inputs": [{"text": SHORT}] * per_request + [{"text": LONG[1]}], "n_samples": 8}
        async with httpx.AsyncClient(base_url=text_server.url, timeout=120) as client:
            return await asyncio.gather(*(client.post("/predict", json=padded) for _ in range(rounds)))

    beside = [r.json() for r in asyncio.run(concurrent())]
    assert {out["timings"]["batch_padded_length"] for out in beside} == {32}

    def draws(outs: list[dict], field: str) -> list[float]:
        return [p["probabilities"]["positive"] if field == "p" else p[field]
                for out in outs for p in out["predictions"][:per_request]]

    for field in ("p", "mutual_information"):
        a, b = draws(alone, field), draws(beside, field)
        se = math.sqrt(statistics.variance(a) / len(a) + statistics.variance(b) / len(b))
        assert statistics.variance(a) > 0  # the noise is on: the test has something to compare
        assert abs(statistics.fmean(a) - statistics.fmean(b)) <= 5 * se + 1e-6, (field, statistics.fmean(a),
                                                                               statistics.fmean(b), se)


def test_mixed_sample_counts_share_one_forward(text_server: Running) -> None:
    counts = [1, 3, 8, 5, 2]
    texts = [SHORT, *LONG, "dull."]
    bodies = [{"inputs": [{"text": text}], "n_samples": n} for text, n in zip(texts, counts, strict=True)]
    before = metric_value(httpx.get(f"{text_server.url}/metrics").text, "director_batch_requests_count",
                          model=TEXT_MODEL, version="1") or 0.0
    responses = one_batch(text_server, TEXT_MODEL, bodies)
    outs = [r.json() for r in responses]
    assert [out["n_samples"] for out in outs] == counts
    for out in outs:
        assert out["timings"]["batch_requests"] == len(bodies) and out["timings"]["batch_rows"] == sum(counts)
        assert out["timings"]["batch_padded_length"] == 32
    assert outs[0]["predictions"][0]["mutual_information"] == 0.0  # n_samples = 1
    text = httpx.get(f"{text_server.url}/metrics").text
    assert metric_value(text, "director_batch_requests_count", model=TEXT_MODEL, version="1") == before + 2  # + seed
    assert (metric_value(text, "director_batch_requests_bucket", model=TEXT_MODEL, version="1", le="4.0") or 0) \
        < before + 2  # the batch of 5 is above that bucket


def test_seeded_text_request_is_reproducible(text_server: Running) -> None:
    body = {"inputs": [{"text": SHORT}, {"text": LONG[0]}], "n_samples": 8, "seed": 99}
    first, second = post(text_server, body), post(text_server, body)
    assert first["predictions"] == second["predictions"] and first["timings"]["batch_requests"] == 1
    unseeded = {"inputs": [{"text": LONG[0]}], "n_samples": 8}
    assert post(text_server, unseeded)["predictions"] != post(text_server, unseeded)["predictions"]


def test_text_metrics_drift_and_feedback(text_server: Running) -> None:
    """20 texts at the default sample count fill the drift window (drift_min_window=20); feedback moves live accuracy;
    every series is labelled with the text model."""
    sentences = [f"{adjective} film, {verdict}." for adjective in ("a lovely", "an awful", "a clumsy", "a moving",
                                                                    "a dull")
                 for verdict in ("loved it", "hated it", "fell asleep", "see it twice")]
    out = post(text_server, {"inputs": [{"text": t} for t in sentences]})
    assert out["n_samples"] == 4 and len(out["predictions"]) == 20
    first = out["predictions"][0]
    feedback = httpx.post(f"{text_server.url}/feedback", json={"id": out["id"], "index": 0, "label": first["label"]})
    assert feedback.status_code == 200, feedback.text
    assert feedback.json()["correct"] is True and feedback.json()["model"] == TEXT_MODEL
    labels = {"model": TEXT_MODEL, "version": "1"}
    text = httpx.get(f"{text_server.url}/metrics").text
    assert (metric_value(text, "director_predictions_total", **labels) or 0) >= 20
    assert metric_value(text, "director_ood_predictions_total", **labels) is not None
    assert metric_value(text, "director_confidence_drift_ks", **labels) is not None
    assert metric_value(text, "director_confidence_drift_psi", **labels) is not None
    assert metric_value(text, "director_live_accuracy_ratio", **labels) is not None
    assert metric_value(text, "director_reference_accuracy_ratio", **labels) is not None
    assert (metric_value(text, "director_prediction_confidence_count", **labels) or 0) >= 20
