"""The committed default model, the version `make serve` answers a request naming neither model nor version
(``tests/repository_facts.py``), served over real HTTP: real Fashion-MNIST images get the right labels, and
uniform noise is flagged OOD far more often than test images."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.repository_facts import default_model, default_version, default_version_dir
from tests.service.conftest import (
    EXAMPLES,
    Running,
    copy_version,
    metric_value,
    png_base64,
    serve,
    settings_for,
)

EXAMPLE_LABELS = {"trouser.png": "Trouser", "bag.png": "Bag", "ankle-boot.png": "Ankle boot"}


@pytest.fixture(scope="module")
def default_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    folder = default_version_dir()
    assert (folder / "manifest.json").is_file(), f"the default model is missing: {folder}"
    tmp = tmp_path_factory.mktemp("default-model")
    copy_version(folder, tmp / "repo", default_model(), default_version())
    with serve(settings_for(tmp / "repo", tmp, default_model=default_model())) as running:
        yield running


def served_test_accuracy(manifest: dict) -> float:
    """The test accuracy the manifest records for the path it serves: ``test_metrics.served`` names it on a version
    the kernel's verdict chose (``posthoc`` or ``director_s<S>``); a version from before the verdict serves DIRECTOR
    at its default sample count."""
    metrics = manifest["provenance"]["test_metrics"]
    served = metrics.get("served", "director")
    key = f"director_s{manifest['sampling']['default_samples']}" if served == "director" else served
    return float(metrics[key]["accuracy"])


def test_example_images_get_their_labels(default_server: Running) -> None:
    for name, label in EXAMPLE_LABELS.items():
        data = (EXAMPLES / name).read_bytes()
        upload = httpx.post(f"{default_server.url}/predict/image", files={"file": (name, data, "image/png")},
                            data={"seed": "0"}, timeout=60)
        assert upload.status_code == 200, upload.text
        assert upload.json()["predictions"][0]["label"] == label, name
        body = {"inputs": [{"image_base64": base64.b64encode(data).decode()}], "seed": 0}
        as_json = httpx.post(f"{default_server.url}/predict", json=body, timeout=60).json()
        assert as_json["predictions"] == upload.json()["predictions"]  # same seed, same pixels, same answer


def test_fashion_mnist_test_images_get_the_right_labels(default_server: Running) -> None:
    from training.data.images import load_fashion_mnist_split

    test = load_fashion_mnist_split("/usr/share/datasets/fashion-mnist", "test")
    n = 200
    images = (test.images[:n, 0].numpy() * 255).round().astype(np.uint8)
    predicted = []
    for start in range(0, n, 50):
        body = {"inputs": [{"image_base64": png_base64(img)} for img in images[start:start + 50]], "seed": start}
        response = httpx.post(f"{default_server.url}/predict", json=body, timeout=120)
        assert response.status_code == 200, response.text
        predicted += [p["class_index"] for p in response.json()["predictions"]]
    accuracy = float(np.mean(np.asarray(predicted) == test.labels[:n].numpy()))
    reported = served_test_accuracy(json.loads((default_version_dir() / "manifest.json").read_text()))
    assert accuracy >= max(0.7, reported - 0.08), (accuracy, reported)


def flagged(server: Running, pixels: np.ndarray, seed: int) -> list[bool]:
    out: list[bool] = []
    for start in range(0, len(pixels), 100):
        body = {"inputs": [{"pixels": p} for p in pixels[start:start + 100].round(4).tolist()], "seed": seed + start}
        response = httpx.post(f"{server.url}/predict", json=body, timeout=120)
        assert response.status_code == 200, response.text
        out += [p["is_ood"] for p in response.json()["predictions"]]
    return out


def test_uniform_noise_is_flagged_ood_far_more_often_than_test_images(default_server: Running) -> None:
    from training.data.images import load_fashion_mnist_split, uniform_noise_images

    test = load_fashion_mnist_split("/usr/share/datasets/fashion-mnist", "test")
    before = httpx.get(f"{default_server.url}/metrics").text
    labels = {"model": default_model(), "version": default_version()}
    ood_before = metric_value(before, "director_ood_predictions_total", **labels) or 0.0
    test_flags = flagged(default_server, test.images[1000:1200].numpy(), seed=1)
    noise_flags = flagged(default_server, uniform_noise_images(200, (1, 28, 28), seed=7).numpy(), seed=2)
    test_rate, noise_rate = float(np.mean(test_flags)), float(np.mean(noise_flags))
    assert noise_rate >= 3 * test_rate and noise_rate >= 0.15, (noise_rate, test_rate)
    after = httpx.get(f"{default_server.url}/metrics").text
    ood_after = metric_value(after, "director_ood_predictions_total", **labels)
    assert ood_after == ood_before + sum(test_flags) + sum(noise_flags)


def test_examples_folder_holds_the_documented_images() -> None:
    assert sorted(p.name for p in Path(EXAMPLES).glob("*.png")) == sorted(EXAMPLE_LABELS)

