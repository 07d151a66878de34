"""The model repository (``service.engine.repository``) on tiny scripted versions in a temp folder, scanned in the
test's own event loop with real batch workers: which folders are served, what a broken, changed, removed, unloaded or
untrusted one becomes, and how a model's config.yaml picks and keeps versions. tests/service/test_repository.py has
the same through a server, with requests in flight."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import torch

from artifact.contract import ARTIFACT, sha256_file
from service.engine import repository as repository_module
from service.engine.device import Device
from service.engine.model_settings import CONFIG_FILE, serving_settings
from service.engine.repository import ModelRepository, VersionState, file_print, fingerprint, without_paths
from tests.service.conftest import until
from tests.service.engine.fakes import WAIT_S, worker
from tests.service.engine.scripted import write_version

CPU = Device(torch.device("cpu"))
Scenario = Callable[[ModelRepository, list[None]], Awaitable[None]]  # the repository and its change notifications


@pytest.fixture(autouse=True)
def heap_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The repository's heap calls, recorded instead of run: a freeze is a full collection of the test process
    (tenths of a second each; tests/service/engine/test_heap.py runs the real ones)."""
    calls: list[str] = []
    monkeypatch.setattr(repository_module, "freeze_long_lived", lambda: calls.append("freeze"))
    monkeypatch.setattr(repository_module, "thaw", lambda: calls.append("thaw"))
    return calls


def run(root: Path, scenario: Scenario, trusted: Path | None = None) -> list[None]:
    """``scenario`` on a repository of ``root`` (max_queue 8 unless a config.yaml says otherwise), closed after it;
    returns one entry per change notification."""
    changes: list[None] = []

    async def main() -> None:
        repository = ModelRepository(
            root, CPU, lambda name, version, artifact, serving: worker(artifact),
            lambda config: serving_settings(config, CPU.shapes, 0.0, 8, 30.0), drain_timeout_s=WAIT_S,
            on_change=lambda: changes.append(None), trusted_digests=trusted)
        try:
            await scenario(repository, changes)
        finally:
            await asyncio.wait_for(repository.close(), WAIT_S)

    asyncio.run(main())
    return changes


def state(repository: ModelRepository, name: str, version: str) -> tuple[VersionState, str | None]:
    entry = repository.get(name, version)
    assert entry is not None, f"{name}/{version} is not known"
    return entry.state, entry.reason


def test_every_published_version_is_served_and_a_broken_one_reported(tmp_path: Path, heap_calls: list[str]) -> None:
    for version in ("1", "2", ".3.tmp"):  # a hidden folder is one being staged
        write_version(tmp_path / "tiny" / version)
    (tmp_path / "broken" / "1").mkdir(parents=True)
    write_version(tmp_path / ".staged" / "1")
    (tmp_path / "README.md").write_text("not a model")

    async def scenario(repository: ModelRepository, changes: list[None]) -> None:
        await repository.scan()
        assert repository.scanned_once
        assert [(v.name, v.version, v.state) for v in repository.all_versions()] == [
            ("broken", "1", VersionState.UNAVAILABLE), ("tiny", "1", VersionState.READY),
            ("tiny", "2", VersionState.READY)]
        assert state(repository, "broken", "1")[1] == "manifest.json is missing"
        default = repository.get("tiny", None)
        assert default is not None and default.version == "2" and default is repository.default_version("tiny")
        ready = default.ready()
        assert ready is not None and (ready.default_samples, ready.max_samples) == (2, 8)
        assert ready.serving.max_queue == 8 and default.method == "unknown"  # the manifest names no method
        assert repository.get("broken", "1").ready() is None  # type: ignore[union-attr]
        assert repository.default_version("broken") is None and repository.get("tiny", "3") is None
        assert repository.is_known("tiny") and not repository.is_known("tiny", ".3.tmp")
        artifacts = [v.artifact for v in repository.all_versions()]
        await repository.scan()  # nothing changed: nothing reloaded
        assert [v.artifact for v in repository.all_versions()] == artifacts

    changes = run(tmp_path, scenario)
    assert heap_calls == ["freeze", "thaw"]  # frozen after the scan that loaded, thawed at close
    assert len(changes) >= 3


def test_a_changed_version_is_swapped_in_and_a_removed_one_retired(tmp_path: Path) -> None:
    write_version(tmp_path / "tiny" / "1")

    async def scenario(repository: ModelRepository, changes: list[None]) -> None:
        await repository.scan()
        first = repository.get("tiny", "1")
        assert first is not None and first.worker is not None and first.artifact is not None
        assert first.artifact.temperature == 1.0
        write_version(tmp_path / "tiny" / "1", temperature=2.0)
        await repository.scan()
        second = repository.get("tiny", "1")
        assert second is not None and second is not first and second.artifact is not None
        assert second.state is VersionState.READY and second.artifact.temperature == 2.0
        await until(lambda: first.worker.closed, "the replaced version's worker to close", WAIT_S)
        shutil.rmtree(tmp_path / "tiny" / "1")
        await repository.scan()
        assert repository.all_versions() == [] and not repository.is_known("tiny")
        await until(lambda: second.worker.closed, "the removed version's worker to close", WAIT_S)

    run(tmp_path, scenario)


def test_a_failed_reload_keeps_the_earlier_files_serving_until_the_folder_changes_again(tmp_path: Path) -> None:
    folder = write_version(tmp_path / "tiny" / "1")

    async def scenario(repository: ModelRepository, changes: list[None]) -> None:
        await repository.scan()
        serving = repository.get("tiny", "1")
        with (folder / ARTIFACT).open("ab") as handle:
            handle.write(b"\0")  # no longer the file the manifest lists
        await repository.scan()
        assert repository.get("tiny", "1") is serving and serving is not None
        assert serving.state is VersionState.READY and serving.worker is not None and not serving.worker.closed
        assert serving.reload_error == "sha256 mismatch or missing file: director.ts"
        notified = len(changes)
        await repository.scan()  # the same broken files are not retried
        assert repository.get("tiny", "1") is serving and len(changes) == notified
        write_version(folder, temperature=3.0)  # fixed
        await repository.scan()
        fixed = repository.get("tiny", "1")
        assert fixed is not serving and fixed is not None and fixed.reload_error is None
        assert fixed.artifact is not None and fixed.artifact.temperature == 3.0

    run(tmp_path, scenario)


def test_a_models_config_picks_its_versions_and_a_bad_one_keeps_the_served_ones(tmp_path: Path) -> None:
    for version in ("1", "2", "10"):
        write_version(tmp_path / "tiny" / version)
    config = tmp_path / "tiny" / CONFIG_FILE
    config.write_text("version_policy: {latest: 2}\nmax_queue: 3\n")

    async def scenario(repository: ModelRepository, changes: list[None]) -> None:
        await repository.scan()
        assert [v.version for v in repository.versions("tiny")] == ["2", "10"]
        served = repository.get("tiny", "10")
        assert served is not None and served.serving is not None and served.serving.max_queue == 3
        assert served.serving.version_policy == {"latest": {"num_versions": 2}}
        config.write_text("version_policy: {latest: 2}\nmax_samples: 16\n")  # above the manifests' 8
        await repository.scan()
        assert repository.get("tiny", "10") is served and served.state is VersionState.READY
        assert served.reload_error == "config.yaml: max_samples 16 is above the manifest's sampling.max_samples 8"
        config.write_text("max_qeue: 3\n")
        await repository.scan()  # no policy to read: every folder, and version 1 cannot load
        one_state, one_reason = state(repository, "tiny", "1")
        assert one_state is VersionState.UNAVAILABLE and one_reason is not None
        assert one_reason.startswith("config.yaml: max_qeue: Extra inputs are not permitted")
        assert repository.get("tiny", "10") is served and served.reload_error == one_reason
        assert isinstance(repository.configs["tiny"], ValueError)

    run(tmp_path, scenario)


def test_an_unloaded_model_stays_out_until_it_is_loaded(tmp_path: Path) -> None:
    write_version(tmp_path / "tiny" / "1")

    async def scenario(repository: ModelRepository, changes: list[None]) -> None:
        await repository.scan()
        first = repository.get("tiny", "1")
        assert first is not None and first.worker is not None
        assert await repository.unload("tiny") and not repository.is_known("tiny")
        await until(lambda: first.worker.closed, "the unloaded version's worker to close", WAIT_S)
        await repository.scan()
        assert not repository.is_known("tiny") and repository.published_models() == ["tiny"]
        assert await repository.load("tiny")
        assert state(repository, "tiny", "1") == (VersionState.READY, None)
        assert not await repository.unload("absent") and not await repository.load("absent")

    run(tmp_path, scenario)


def test_an_allowlist_edit_rechecks_every_version_and_links_out_are_refused(tmp_path: Path) -> None:
    root, trusted = tmp_path / "repository", tmp_path / "digests"
    folder = write_version(root / "tiny" / "1")
    write_version(tmp_path / "elsewhere" / "1")
    (root / "linked").symlink_to(tmp_path / "elsewhere")
    trusted.write_text("# nothing trusted yet\n")

    async def scenario(repository: ModelRepository, changes: list[None]) -> None:
        await repository.scan()
        digest = sha256_file(folder / ARTIFACT)
        assert state(repository, "tiny", "1") == (
            VersionState.UNAVAILABLE, f"director.ts sha256 {digest} is not in the trusted digests file")
        assert state(repository, "linked", "1") == (
            VersionState.UNAVAILABLE, "linked/1 resolves outside the model repository (symlinks may not leave it)")
        trusted.write_text(f"{digest}\n")
        await repository.scan()
        assert state(repository, "tiny", "1") == (VersionState.READY, None)

    run(root, scenario, trusted)


def test_start_scans_first_then_runs_the_callback(tmp_path: Path) -> None:
    write_version(tmp_path / "tiny" / "1")
    after: list[bool] = []

    async def scenario(repository: ModelRepository, changes: list[None]) -> None:
        async def after_first_scan() -> None:
            after.append(repository.get("tiny", "1") is not None)

        repository.start(0, after_first_scan)
        await asyncio.wait_for(repository.first_scan(), WAIT_S)
        assert state(repository, "tiny", "1") == (VersionState.READY, None)
        await until(lambda: after, "the callback", WAIT_S)

    run(tmp_path, scenario)
    assert after == [True]


def test_fingerprints_and_reasons(tmp_path: Path) -> None:
    folder = write_version(tmp_path / "tiny" / "1")
    (folder / "sub").mkdir()  # folders are not part of it
    before = fingerprint(folder)
    assert [name for name, _, _ in before] == ["director.ts", "manifest.json"]
    (folder / "notes.txt").write_text("x")
    assert fingerprint(folder) != before and fingerprint(tmp_path / "absent") == ()
    assert file_print(None) is None and file_print(tmp_path / "absent") == (-1, -1)
    assert file_print(folder / "notes.txt") == (1, (folder / "notes.txt").stat().st_mtime_ns)
    reason = f"torch.jit.load failed: open {tmp_path}/tiny/1/director.ts; in {tmp_path}"
    assert without_paths(reason, tmp_path) == "torch.jit.load failed: open tiny/1/director.ts; in <repository>"
