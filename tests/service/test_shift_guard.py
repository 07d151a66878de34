"""The shift guard over real HTTP on the tiny model: a batch of Fashion-MNIST test images keeps its sets and answers,
the same images rotated by 90 degrees are called shifted (their OOD flags, far more than the 5% in-distribution inputs
get), their sets widen to every label and every one abstains, the answer says why, and each input says whether it
looks exchangeable; over OIP the same flag is an output."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from tests.conftest import FASHION_ROOT
from tests.service.conftest import Running, serve, settings_for
from training.data.images import load_fashion_mnist_split

INPUTS = 32  # the tiny server takes at most 32 inputs a request


def images(rotate: bool) -> list[list[list[list[float]]]]:
    split = load_fashion_mnist_split(FASHION_ROOT, "test")
    batch = split.images[-INPUTS:]  # [N, 1, 28, 28], the test split's last images (the tiny model saw none)
    if rotate:
        batch = torch.rot90(batch, 1, dims=(2, 3))
    return batch.round(decimals=4).tolist()


def predict(server: Running, pixels: list[Any], **asks: Any) -> dict[str, Any]:
    body = {"inputs": [{"pixels": p} for p in pixels], "seed": 0, **asks}
    response = httpx.post(f"{server.url}/predict", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.fixture
def fresh_server(tiny_repository: Path, tmp_path: Path) -> Iterator[Running]:
    """A server of its own: its live drift window has seen none of the other tests' random inputs."""
    with serve(settings_for(tiny_repository, tmp_path)) as running:
        yield running


def test_a_rotated_batch_is_called_shifted_and_its_decisions_say_so(fresh_server: Running) -> None:
    tiny_server = fresh_server
    upright = predict(tiny_server, images(rotate=False), coverage=0.9, max_risk=0.3)
    assert "shift" not in upright["decisions"] and upright["decisions"]["widen_if_shifted"] is True
    flagged = [p["is_ood"] for p in upright["predictions"]]
    assert [p["exchangeable"] for p in upright["predictions"]] == [not flag for flag in flagged]

    rotated = predict(tiny_server, images(rotate=True), coverage=0.9, max_risk=0.3)
    shift = rotated["decisions"]["shift"]
    flagged_share = sum(p["is_ood"] for p in rotated["predictions"]) / INPUTS
    assert f"of the request's {INPUTS} inputs are flagged OOD" in shift and flagged_share > 0.1, shift
    labels = len(rotated["predictions"][0]["probabilities"])
    assert all(p["set_size"] == labels and p["abstain"] and not p["exchangeable"] for p in rotated["predictions"])

    kept = predict(tiny_server, images(rotate=True), coverage=0.9, max_risk=0.3, widen_if_shifted=False,
                   abstain_if_ood=False)
    assert kept["decisions"]["shift"] == shift and kept["decisions"]["abstain_if_ood"] is False
    assert any(p["set_size"] < labels for p in kept["predictions"])  # the calibrated sets, promising nothing here


def test_the_exchangeable_flag_is_an_oip_output(tiny_server: Running) -> None:
    pixels = images(rotate=True)
    body = {"inputs": [{"name": "pixels", "datatype": "FP32", "shape": [INPUTS, 1, 28, 28], "data": pixels}],
            "parameters": {"coverage": 0.9, "seed": 0}}
    response = httpx.post(f"{tiny_server.url}/v2/models/tiny/infer", json=body, timeout=120)
    assert response.status_code == 200, response.text
    outputs = {o["name"]: o for o in response.json()["outputs"]}
    assert outputs["exchangeable"]["datatype"] == "BOOL" and not any(outputs["exchangeable"]["data"])
    assert "flagged OOD" in response.json()["parameters"]["shift"]
