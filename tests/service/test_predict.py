"""POST /predict and /predict/image on the real tiny artifact over real HTTP."""

from __future__ import annotations

import asyncio
import base64
import io
import math

import httpx
import numpy as np
from PIL import Image

from service.api.protocol import PredictResponse
from tests.service.conftest import Running, metric_value, png_base64, random_pixels


def test_response_has_every_field_and_consistent_uncertainty(tiny_server: Running) -> None:
    rng = np.random.default_rng(0)
    body = {"inputs": [{"pixels": p} for p in random_pixels(rng, 3)], "n_samples": 4}
    response = httpx.post(f"{tiny_server.url}/predict", json=body, timeout=30)
    assert response.status_code == 200, response.text
    out = response.json()
    assert out["model"] == "tiny" and out["model_version"] == "1" and out["n_samples"] == 4
    assert len(out["id"]) == 32
    assert out["ood"]["calibrated_n_samples"] == 4 and "note" not in out["ood"]
    assert set(out["timings"]) == {"queue_ms", "inference_ms", "total_ms", "batch_requests", "batch_rows"}
    assert [p["index"] for p in out["predictions"]] == [0, 1, 2]
    for p in out["predictions"]:
        probs = p["probabilities"]
        assert len(probs) == 10 and math.isclose(sum(probs.values()), 1.0, abs_tol=1e-5)
        assert p["confidence"] == max(probs.values())
        assert p["label"] == max(probs, key=probs.get) and list(probs)[p["class_index"]] == p["label"]
        assert p["mutual_information"] >= 0.0
        assert math.isclose(p["mutual_information"], max(0.0, p["predictive_entropy"] - p["expected_entropy"]),
                            abs_tol=1e-5)
        assert p["is_ood"] == (p["ood_score"] > out["ood"]["threshold"])


def test_response_is_exactly_the_documented_schema(tiny_server: Running) -> None:
    """The route writes its JSON itself (no second validation): read back through the response model it loses and
    gains nothing, with and without probabilities, with and without an OOD note."""
    rng = np.random.default_rng(5)
    for extra in ({"n_samples": 4}, {"n_samples": 7, "return_probabilities": False}):
        body = {"inputs": [{"pixels": p} for p in random_pixels(rng, 2)], **extra}
        response = httpx.post(f"{tiny_server.url}/predict", json=body, timeout=30)
        assert response.status_code == 200 and response.headers["content-type"] == "application/json"
        out = response.json()
        assert PredictResponse.model_validate(out).model_dump(exclude_none=True) == out


def test_single_sample_has_zero_mutual_information(tiny_server: Running) -> None:
    body = {"inputs": [{"pixels": random_pixels(np.random.default_rng(1))[0]}], "n_samples": 1,
            "return_probabilities": False}
    out = httpx.post(f"{tiny_server.url}/predict", json=body, timeout=30).json()
    prediction = out["predictions"][0]
    assert prediction["mutual_information"] == 0.0 and "probabilities" not in prediction
    assert out["ood"]["score"] != "mutual_information" and out["ood"]["calibrated_n_samples"] == 1


def test_sample_count_without_threshold_uses_the_nearest_and_says_so(tiny_server: Running) -> None:
    body = {"inputs": [{"pixels": random_pixels(np.random.default_rng(2))[0]}], "n_samples": 7}
    out = httpx.post(f"{tiny_server.url}/predict", json=body, timeout=30).json()
    assert out["n_samples"] == 7
    assert out["ood"]["calibrated_n_samples"] == 4  # the tiny manifest has thresholds at 1, 2, 4
    assert "nearest" in out["ood"]["note"]


def test_default_sample_count_comes_from_the_manifest(tiny_server: Running) -> None:
    body = {"inputs": [{"pixels": random_pixels(np.random.default_rng(3))[0]}]}
    assert httpx.post(f"{tiny_server.url}/predict", json=body, timeout=30).json()["n_samples"] == 4


def test_png_jpeg_and_pixels_agree_after_conversion(tiny_server: Running) -> None:
    """A 56x40 RGB PNG is converted to 28x28 grayscale (PIL L, bilinear); the same pixels sent as an array under
    the same seed give exactly the same answer."""
    rng = np.random.default_rng(4)
    rgb = (rng.random((40, 56, 3)) * 255).astype(np.uint8)
    converted = np.asarray(Image.fromarray(rgb).convert("L").resize((28, 28), Image.Resampling.BILINEAR))
    as_image = {"inputs": [{"image_base64": png_base64(rgb)}], "n_samples": 4, "seed": 11}
    as_pixels = {"inputs": [{"pixels": (converted.astype(np.float32) / 255.0).tolist()}], "n_samples": 4, "seed": 11}
    a = httpx.post(f"{tiny_server.url}/predict", json=as_image, timeout=30).json()["predictions"]
    b = httpx.post(f"{tiny_server.url}/predict", json=as_pixels, timeout=30).json()["predictions"]
    assert a == b
    rgba = np.dstack([rgb, np.full((40, 56), 255, np.uint8)])  # opaque alpha: same as RGB
    as_rgba = {"inputs": [{"image_base64": png_base64(rgba)}], "n_samples": 4, "seed": 11}
    assert httpx.post(f"{tiny_server.url}/predict", json=as_rgba, timeout=30).json()["predictions"] == a
    jpeg = io.BytesIO()
    Image.fromarray(rgb).save(jpeg, format="JPEG", quality=95)
    body = {"inputs": [{"image_base64": base64.b64encode(jpeg.getvalue()).decode()}], "n_samples": 2}
    response = httpx.post(f"{tiny_server.url}/predict", json=body, timeout=30)
    assert response.status_code == 200 and len(response.json()["predictions"]) == 1


def test_seeded_request_is_reproducible_and_unseeded_requests_differ(tiny_server: Running) -> None:
    pixels = random_pixels(np.random.default_rng(5))[0]
    seeded = {"inputs": [{"pixels": pixels}], "n_samples": 8, "seed": 1234}
    first = httpx.post(f"{tiny_server.url}/predict", json=seeded, timeout=30).json()
    second = httpx.post(f"{tiny_server.url}/predict", json=seeded, timeout=30).json()
    assert first["predictions"] == second["predictions"]
    assert first["timings"]["batch_requests"] == 1
    unseeded = {"inputs": [{"pixels": pixels}], "n_samples": 8}
    a = httpx.post(f"{tiny_server.url}/predict", json=unseeded, timeout=30).json()["predictions"][0]
    b = httpx.post(f"{tiny_server.url}/predict", json=unseeded, timeout=30).json()["predictions"][0]
    assert a["probabilities"] != b["probabilities"]  # independent draws


def test_concurrent_mixed_sample_counts_share_forwards(tiny_server: Running) -> None:
    rng = np.random.default_rng(6)
    counts = [1, 2, 4, 8] * 6

    async def fire() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=tiny_server.url, timeout=60) as client:
            bodies = [{"inputs": [{"pixels": random_pixels(rng)[0]}], "n_samples": s} for s in counts]
            return await asyncio.gather(*(client.post("/predict", json=b) for b in bodies))

    responses = asyncio.run(fire())
    assert all(r.status_code == 200 for r in responses), [r.text for r in responses if r.status_code != 200]
    assert [r.json()["n_samples"] for r in responses] == counts
    assert max(r.json()["timings"]["batch_requests"] for r in responses) > 1
    text = httpx.get(f"{tiny_server.url}/metrics").text
    total = metric_value(text, "director_batch_size_count", model="tiny", version="1")
    single = metric_value(text, "director_batch_size_bucket", model="tiny", version="1", le="1.0")
    assert total is not None and single is not None and single < total  # some forwards held more than one input
    requests_count = metric_value(text, "director_batch_requests_count", model="tiny", version="1")
    assert requests_count is not None and requests_count < metric_value(
        text, "director_predictions_total", model="tiny", version="1")


def test_multipart_upload(tiny_server: Running) -> None:
    image = png_base64((np.random.default_rng(7).random((40, 30)) * 255).astype(np.uint8))
    files = {"file": ("shirt.png", base64.b64decode(image), "image/png")}
    response = httpx.post(f"{tiny_server.url}/predict/image", files=files, data={"n_samples": "2", "seed": "3"},
                          timeout=30)
    assert response.status_code == 200, response.text
    out = response.json()
    assert out["n_samples"] == 2 and len(out["predictions"]) == 1
    bad = httpx.post(f"{tiny_server.url}/predict/image", files={"file": ("x.png", b"not an image", "image/png")},
                     timeout=30)
    assert bad.status_code == 400 and bad.json()["type"] == "bad_request"
