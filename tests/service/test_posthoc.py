"""A version that serves the post-hoc path (``method: posthoc``: the backbone's own forward with DIRECTOR's post-hoc
tools, no kernel) is served through the same contract over real HTTP: the same response fields, every sample the
same row, its feature score as the OOD score, and the kernel's verdict on ``GET /models`` and in Triton's model
configuration."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch

from tests.service.conftest import Running, copy_version, serve, settings_for


@pytest.fixture(scope="module")
def posthoc_server(posthoc_export: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    tmp = tmp_path_factory.mktemp("posthoc-server")
    copy_version(posthoc_export[1], tmp / "repo", "tiny", "1")
    with serve(settings_for(tmp / "repo", tmp)) as running:
        yield running


def test_a_posthoc_version_answers_with_every_field(posthoc_server: Running, posthoc_export: tuple[Path, Path]
                                                    ) -> None:
    manifest = json.loads((posthoc_export[1] / "manifest.json").read_text())
    pixels = torch.rand(2, 1, 28, 28, generator=torch.Generator().manual_seed(0)).tolist()
    response = httpx.post(f"{posthoc_server.url}/predict", timeout=60,
                          json={"inputs": [{"pixels": p} for p in pixels], "n_samples": 4})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["n_samples"] == 4 and body["ood"]["score"] == manifest["ood"]["score"]
    for prediction in body["predictions"]:
        assert prediction["mutual_information"] == 0.0
        assert prediction["expected_entropy"] == pytest.approx(prediction["predictive_entropy"], abs=1e-6)
        assert prediction["is_ood"] == (prediction["ood_score"] > manifest["ood"]["thresholds"]["4"]["threshold"])


def test_models_and_the_triton_config_say_what_the_kernel_adds(posthoc_server: Running,
                                                               posthoc_export: tuple[Path, Path]) -> None:
    sentence = json.loads((posthoc_export[1] / "manifest.json").read_text())["kernel_verdict"]["sentence"]
    version = httpx.get(f"{posthoc_server.url}/models/tiny", timeout=10).json()["versions"][0]
    assert version["method"] == "posthoc" and version["kernel_verdict"] == sentence
    assert version["samples_informative"] is False and "post-hoc path" in version["samples_note"]
    config = httpx.get(f"{posthoc_server.url}/v2/models/tiny/config", timeout=10).json()
    assert config["parameters"]["method"]["string_value"] == "posthoc"
    assert config["parameters"]["kernel_verdict"]["string_value"] == sentence
