"""What the server agrees to load, over real HTTP: folders that leave the repository through a symlink are refused,
and with ``DIRECTOR_TRUSTED_DIGESTS`` an artifact whose digest is not listed is refused before it is loaded; both
are reported in ``/models`` with the reason while the trusted versions serve. Also: files a manifest names must stay
inside the version folder, an allowlist edit takes effect at the next scan, and a failed reload keeps the version's
earlier files serving."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import torch

from artifact.contract import ARTIFACT, MANIFEST, sha256_file
from tests.service.conftest import copy_version, random_pixels, serve, settings_for, wait_for

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


def entry_once(url: str, model: str, version: str, predicate: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """The version's ``/models`` entry once ``predicate`` holds (the repository is polled)."""
    entries: list[dict[str, Any]] = []

    def holds() -> bool:
        versions = httpx.get(f"{url}/models/{model}", timeout=30).json()["versions"]
        entries.append({v["version"]: v for v in versions}.get(version, {}))
        return predicate(entries[-1])

    wait_for(holds, f"{model} version {version}'s entry in /models", timeout_s=30, poll_s=0.1)
    return entries[-1]


def test_files_named_outside_the_version_folder_are_refused(tiny_artifact: Path, tmp_path: Path) -> None:
    """A link to a TorchScript file elsewhere, and ``files`` entries that are absolute or climb out with ``..``:
    each refused with the reason, which carries no absolute path."""
    repository, outside = tmp_path / "repo", tmp_path / "elsewhere"
    copy_version(tiny_artifact, repository, "tiny", "1")
    outside.mkdir()
    shutil.copy(tiny_artifact / ARTIFACT, outside / ARTIFACT)
    linked = copy_version(tiny_artifact, repository, "tiny", "2")
    (linked / ARTIFACT).unlink()
    (linked / ARTIFACT).symlink_to(outside / ARTIFACT)
    for version, name in (("3", str(outside / ARTIFACT)), ("4", f"../1/{ARTIFACT}")):
        folder = copy_version(tiny_artifact, repository, "tiny", version)
        manifest = json.loads((folder / MANIFEST).read_text())
        manifest["files"][name] = {"sha256": sha256_file(tiny_artifact / ARTIFACT)}  # its real digest
        (folder / MANIFEST).write_text(json.dumps(manifest))
    with serve(settings_for(repository, tmp_path)) as server:
        tiny = states(server.url, "tiny")
        assert tiny["1"] == ("ready", None)
        for version in ("2", "3", "4"):
            state, reason = tiny[version]
            assert state == "unavailable" and "resolve outside the version folder" in (reason or ""), reason
        assert str(tmp_path) not in httpx.get(f"{server.url}/models/tiny", timeout=30).text
        assert httpx.post(f"{server.url}/predict", json=BODY, timeout=60).json()["model_version"] == "1"


def test_a_tokenizer_named_outside_the_version_folder_is_refused(tiny_text_artifact: Path, tmp_path: Path) -> None:
    """A text manifest whose tokenizer climbs out with ``..`` to a real tokenizer file (its digest listed and right)
    is refused with the reason, as any other named file; the reason carries no absolute path."""
    repository = tmp_path / "repo"
    copy_version(tiny_text_artifact, repository, "text", "1")
    climbing = copy_version(tiny_text_artifact, repository, "text", "2")
    manifest = json.loads((climbing / MANIFEST).read_text())
    tokenizer = manifest["input"]["tokenizer"]
    (climbing / tokenizer).unlink()
    del manifest["files"][tokenizer]
    manifest["input"]["tokenizer"] = f"../../text/1/{tokenizer}"
    manifest["files"][f"../../text/1/{tokenizer}"] = {"sha256": sha256_file(tiny_text_artifact / tokenizer)}
    (climbing / MANIFEST).write_text(json.dumps(manifest))
    with serve(settings_for(repository, tmp_path, default_model="text")) as server:
        text = states(server.url, "text")
        assert text["1"] == ("ready", None)
        state, reason = text["2"]
        assert state == "unavailable" and "resolve outside the version folder" in (reason or ""), reason
        assert str(tmp_path) not in httpx.get(f"{server.url}/models/text", timeout=30).text
        refused = httpx.post(f"{server.url}/predict", json={"model": "text", "version": "2",
                                                            "inputs": [{"text": "a"}]}, timeout=30)
        assert refused.status_code == 503 and "resolve outside the version folder" in refused.json()["error"]
        assert str(tmp_path) not in refused.text  # the 503 body says why, without a path of the host


def test_an_allowlist_edit_takes_effect_at_the_next_scan(tiny_artifact: Path, tmp_path: Path) -> None:
    repository = tmp_path / "repo"
    copy_version(tiny_artifact, repository, "tiny", "1")
    other = copy_version(tiny_artifact, repository, "tiny", "2")
    scripted = torch.jit.load(str(tiny_artifact / ARTIFACT))
    torch.jit.save(scripted, str(other / ARTIFACT))  # the same model, saved again: another digest
    manifest = json.loads((other / MANIFEST).read_text())
    manifest["files"][ARTIFACT] = {"sha256": sha256_file(other / ARTIFACT)}
    (other / MANIFEST).write_text(json.dumps(manifest))
    allowlist = tmp_path / "trusted.sha256"
    allowlist.write_text(f"{sha256_file(tiny_artifact / ARTIFACT)}\n")
    with serve(settings_for(repository, tmp_path, trusted_digests=allowlist, poll_interval_s=0.1)) as server:
        assert states(server.url, "tiny")["2"][0] == "unavailable"
        with allowlist.open("a") as handle:
            handle.write(f"{sha256_file(other / ARTIFACT)}\n")
        entry_once(server.url, "tiny", "2", lambda v: v.get("state") == "ready")  # the folder itself never changed
        assert httpx.post(f"{server.url}/predict", json=BODY, timeout=60).json()["model_version"] == "2"


def test_a_failed_reload_keeps_the_version_serving(tiny_artifact: Path, tmp_path: Path) -> None:
    """A serving version's TorchScript file overwritten with garbage: the version keeps serving what it loaded, says
    why in ``reload_error``, and the default does not fall back to another version."""
    repository = tmp_path / "repo"
    copy_version(tiny_artifact, repository, "tiny", "1")
    serving = copy_version(tiny_artifact, repository, "tiny", "2")
    with serve(settings_for(repository, tmp_path, poll_interval_s=0.1)) as server:
        (serving / ARTIFACT).write_bytes(b"not a model any more")
        entry = entry_once(server.url, "tiny", "2", lambda v: v.get("reload_error") is not None)
        assert entry["state"] == "ready" and "sha256 mismatch" in entry["reload_error"]
        for _ in range(3):
            response = httpx.post(f"{server.url}/predict", json=BODY, timeout=60)
            assert response.status_code == 200 and response.json()["model_version"] == "2"
        shutil.copy(tiny_artifact / ARTIFACT, serving / ARTIFACT)  # repaired: reloaded, the error gone
        entry_once(server.url, "tiny", "2", lambda v: v.get("state") == "ready" and v.get("reload_error") is None)
