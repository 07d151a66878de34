"""The model lifecycle and feedback under attack, over real HTTP: a model's default never moves back to an older
version while its versions load (503 with Retry-After meanwhile, never a non-retryable 4xx), feedback is checked
against the logged prediction's own labels while its model is unloaded, and an unknown label is not echoed whole."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from pydantic import SecretStr

import service.engine.repository as repository_module
from tests.service.conftest import copy_version, random_pixels, rehash, serve, settings_for, wait_for

KEY = "control-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


def without_conformal(tiny_artifact: Path, repository: Path, version: str) -> Path:
    """A version of the tiny model exported without a calibration split: it answers no coverage."""
    folder = copy_version(tiny_artifact, repository, "tiny", version)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest.pop("conformal")
    manifest["files"].pop("conformal.json")
    (folder / "conformal.json").unlink()
    rehash(folder, manifest)
    return folder


class Gate:
    """Holds the real load of one version folder until ``open``: a slow artifact, without a slow artifact."""

    def __init__(self, version: str) -> None:
        self.version, self.opened, self.waiting = version, threading.Event(), threading.Event()
        self.load = repository_module.load_artifact

    def __call__(self, folder: Path, device: Any) -> Any:
        if folder.name == self.version:
            self.waiting.set()
            assert self.opened.wait(timeout=120), "the gate was never opened"
        return self.load(folder, device)


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[Gate]:
    held = Gate("3")
    held.opened.set()  # open until a test closes it
    monkeypatch.setattr(repository_module, "load_artifact", held)
    yield held
    held.opened.set()


def body(**extra: Any) -> dict[str, Any]:
    return {"inputs": [{"pixels": random_pixels(np.random.default_rng(0))[0]}], **extra}


def test_the_default_never_moves_back_while_its_versions_load(tiny_artifact: Path, tmp_path: Path,
                                                              gate: Gate) -> None:
    """Version 1 has no conformal part, 2 and 3 have. While 3 loads after a repository load, plain and coverage
    requests get 503 with Retry-After (no answer from 1 or 2, no 400 for 1's missing calibration); a new version 3
    appearing while 2 serves leaves 2 serving until 3 is ready."""
    repository = tmp_path / "repo"
    without_conformal(tiny_artifact, repository, "1")
    copy_version(tiny_artifact, repository, "tiny", "2")
    settings = settings_for(repository, tmp_path, api_key=SecretStr(KEY))
    with serve(settings) as server, httpx.Client(base_url=server.url, headers=AUTH, timeout=60) as client:
        assert client.post("/predict", json=body()).json()["model_version"] == "2"
        gate.opened.clear()
        copy_version(tiny_artifact, repository, "tiny", "3")
        scan = threading.Thread(target=lambda: client.post("/v2/repository/models/tiny/load"))
        scan.start()
        wait_for(gate.waiting.is_set, "version 3 to start loading")
        for _ in range(5):  # a new version loading: the one serving keeps serving
            assert client.post("/predict", json=body(coverage=0.9)).json()["model_version"] == "2"
        gate.opened.set()
        scan.join(timeout=120)
        assert client.post("/predict", json=body()).json()["model_version"] == "3"

        assert client.post("/v2/repository/models/tiny/unload").status_code == 200
        gate.opened.clear()
        gate.waiting.clear()
        answers: list[httpx.Response] = []
        load = threading.Thread(target=lambda: answers.append(client.post("/v2/repository/models/tiny/load")))
        load.start()
        wait_for(gate.waiting.is_set, "version 3 to start loading again")
        for request in (body(), body(coverage=0.9), body(max_risk=0.2)):
            refused = client.post("/predict", json=request)
            assert refused.status_code == 503 and refused.headers["Retry-After"], refused.text
            assert "loading" in refused.json()["error"]
        assert client.post("/v2/models/tiny/infer", json={"inputs": []}).status_code in (400, 422, 503)
        gate.opened.set()
        load.join(timeout=120)
        assert answers[0].status_code == 200, answers[0].text
        versions = [client.post("/predict", json=body(coverage=0.9)).json()["model_version"] for _ in range(5)]
        assert versions == ["3"] * 5


def test_feedback_checks_the_logged_labels_while_the_model_is_unloaded(tiny_artifact: Path, tmp_path: Path,
                                                                       gate: Gate) -> None:
    repository = tmp_path / "repo"
    copy_version(tiny_artifact, repository, "tiny", "1")
    with serve(settings_for(repository, tmp_path, api_key=SecretStr(KEY))) as server, \
            httpx.Client(base_url=server.url, headers=AUTH, timeout=60) as client:
        predicted = client.post("/predict", json=body()).json()
        assert client.post("/v2/repository/models/tiny/unload").status_code == 200
        for label in ("NoSuchLabel", ["T-shirt/top"], 99):
            refused = client.post("/feedback", json={"id": predicted["id"], "index": 0, "label": label})
            assert refused.status_code == 422, (label, refused.text)
        accepted = client.post("/feedback", json={"id": predicted["id"], "index": 0,
                                                  "label": predicted["predictions"][0]["label"]})
        assert accepted.status_code == 200 and accepted.json()["correct"] is True, accepted.text


def test_an_unknown_label_is_not_echoed_whole(tiny_server: Any) -> None:
    predicted = httpx.post(f"{tiny_server.url}/predict", json=body(), timeout=60).json()
    huge = "x" * 2_000_000
    refused = httpx.post(f"{tiny_server.url}/feedback", json={"id": predicted["id"], "label": huge}, timeout=60)
    assert refused.status_code == 422 and "2,000,000 characters" in refused.json()["error"]
    assert len(refused.content) < 4000
