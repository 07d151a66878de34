"""What the server agrees to load, over real HTTP: folders that leave the repository through a symlink are refused,
and with ``DIRECTOR_TRUSTED_DIGESTS`` an artifact whose digest is not listed is refused before it is loaded; both
are reported in ``/models`` with the reason while the trusted versions serve."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import numpy as np

from artifact.contract import ARTIFACT, sha256_file
from tests.service.conftest import copy_version, random_pixels, serve, settings_for

BODY = {"inputs": [{"pixels": random_pixels(np.random.default_rng(0))[0]}], "n_samples": 1}


def states(url: str, model: str) -> dict[str, tuple[str, str | None]]:
    response = httpx.get(f"{url}/models/{model}", timeout=30)
    assert response.status_code == 200, response.text
    return {v["version"]: (v["state"], v["reason"]) for v in response.json()["versions"]}


def test_symlinks_leaving_the_repository_are_refused(tiny_artifact: Path, tmp_path: Path) -> None:
    repository, outside = tmp_path / "repo", tmp_path / "elsewhere"
    copy_version(tiny_artifact, repository, "tiny", "1")
    shutil.copytree(tiny_artifact, outside / "model" / "1")
    (repository / "tiny" / "2").symlink_to(outside / "model" / "1")  # a version folder leaving the repository
    (repository / "linked").symlink_to(outside / "model")  # a model folder leaving it
    (repository / "tiny" / "3").symlink_to(repository / "tiny" / "1")  # a link inside the repository is fine
    with serve(settings_for(repository, tmp_path)) as server:
        tiny = states(server.url, "tiny")
        assert tiny["1"] == ("ready", None) and tiny["3"] == ("ready", None)
        state, reason = tiny["2"]
        assert state == "unavailable" and "outside the model repository" in (reason or "")
        state, reason = states(server.url, "linked")["1"]
        assert state == "unavailable" and "outside the model repository" in (reason or "")
        response = httpx.post(f"{server.url}/predict", json={**BODY, "version": "2"}, timeout=60)
        assert response.status_code == 503 and "unavailable" in response.text  # never loaded, never served


def test_only_listed_digests_are_loaded(tiny_artifact: Path, tmp_path: Path) -> None:
    repository = tmp_path / "repo"
    copy_version(tiny_artifact, repository, "tiny", "1")
    untrusted = copy_version(tiny_artifact, repository, "tiny", "2")
    # not TorchScript at all: refused for its digest, so torch.jit.load never ran on it (its error would differ)
    (untrusted / ARTIFACT).write_bytes(b"not a model")
    allowlist = tmp_path / "trusted.sha256"
    allowlist.write_text(f"# artifacts we built\n{sha256_file(tiny_artifact / ARTIFACT)}  tiny/1/{ARTIFACT}\n\n")
    with serve(settings_for(repository, tmp_path, trusted_digests=allowlist)) as server:
        tiny = states(server.url, "tiny")
        assert tiny["1"] == ("ready", None)
        state, reason = tiny["2"]
        assert state == "unavailable" and "is not in the trusted digests" in (reason or ""), reason
        assert httpx.post(f"{server.url}/predict", json=BODY, timeout=60).json()["model_version"] == "1"


def test_an_unreadable_allowlist_refuses_everything(tiny_artifact: Path, tmp_path: Path) -> None:
    repository = tmp_path / "repo"
    copy_version(tiny_artifact, repository, "tiny", "1")
    for allowlist, expected in ((tmp_path / "missing.sha256", "cannot read the trusted digests file"),
                                (tmp_path / "bad.sha256", "not a sha256 digest")):
        if allowlist.name == "bad.sha256":
            allowlist.write_text("deadbeef  tiny/1/director.ts\n")
        with serve(settings_for(repository, tmp_path, trusted_digests=allowlist), wait_ready=False) as server:
            state, reason = states(server.url, "tiny")["1"]
            assert state == "unavailable" and expected in (reason or ""), reason
            assert httpx.get(f"{server.url}/health/ready", timeout=30).status_code == 503
