"""A model's ``config.yaml`` written by a careless or hostile operator: whatever the file holds, it is that model's
error and never the repository's. Deep nesting (the YAML composer recurses once per level), alias bombs, huge files,
values without bounds, non-numeric versions, empty files, symlink loops and links out of the repository are refused
with a reason; an unchanged file is not parsed again; the model's last good settings stay; and a bad file at startup
leaves every other model served and its own served once fixed."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

import service.engine.repository as repository_module
from service.engine.model_settings import MAX_CONFIG_BYTES, read_config, serving_settings
from service.engine.shapes import BatchShapes
from tests.service.conftest import copy_version, serve, settings_for, wait_for

ALIAS_BOMB = ("a: &a [x, x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
              "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
              "version_policy: {all: {bomb: [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]}}\n")
REFUSED = [
    ("version_policy: {all: " + "[" * 2000 + "]" * 2000 + "}\n", "nested deeper than 8 levels"),
    (ALIAS_BOMB, "aliases (*name) are not allowed"),
    ("max_batch_delay_ms: 1000000\n", "max_batch_delay_ms: Input should be less than or equal to 1000"),
    ("max_batch_delay_ms: 1.0e+20\n", "max_batch_delay_ms: Input should be less than or equal to 1000"),
    ("request_timeout_s: .inf\n", "request_timeout_s: Input should be a finite number"),
    ("request_timeout_s: .nan\n", "request_timeout_s: Input should be a finite number"),
    ("max_queue: 100000000000\n", "max_queue: Input should be less than or equal to 1048576"),
    ("version_policy: {specific: [7, beta]}\n", "'beta' is not a version number"),
    ("version_policy: {specific: [-1]}\n", "-1 is not a version number"),
    ("version_policy: {all: {x: 1}}\n", "version_policy.all: Dictionary should have at most 0 items"),
    ("", "config.yaml is empty (write {} for no overrides)"),
    ("# only a comment\n", "config.yaml is empty"),
    ("# " + "x" * MAX_CONFIG_BYTES + "\n", "larger than 64 KiB"),
    (b"max_queue: 8 \xff\n", "cannot be read: UnicodeDecodeError"),
]


@pytest.mark.parametrize(("text", "message"), REFUSED, ids=[str(i) for i in range(len(REFUSED))])
def test_a_config_that_cannot_be_used_is_refused_with_its_reason(tmp_path: Path, text: str | bytes,
                                                                   message: str) -> None:
    model = tmp_path / "model"
    model.mkdir()
    path = model / "config.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ValueError, match="config.yaml") as error:
        read_config(model)
    assert message in str(error.value), str(error.value)
    assert len(str(error.value)) < 1500


def test_symlinks_out_of_the_repository_and_loops_are_refused(tmp_path: Path) -> None:
    repository, outside = tmp_path / "repository", tmp_path / "outside.yaml"
    model = repository / "model"
    model.mkdir(parents=True)
    outside.write_text("max_queue: 8\n")
    (model / "config.yaml").symlink_to(outside)
    with pytest.raises(ValueError, match="links outside the model repository"):
        read_config(model)
    shared = repository / "shared.yaml"  # a link inside the repository is followed
    shared.write_text("max_queue: 8\n")
    (model / "config.yaml").unlink()
    (model / "config.yaml").symlink_to(shared)
    config = read_config(model)
    assert config is not None and config.max_queue == 8
    (model / "config.yaml").unlink()
    (model / "config.yaml").symlink_to(model / "config.yaml")  # a loop
    with pytest.raises(ValueError, match="cannot be read"):
        read_config(model)


def test_a_batch_delay_that_leaves_no_time_within_the_timeout_is_refused(tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.yaml").write_text("max_batch_delay_ms: 800\nrequest_timeout_s: 0.5\n")
    shapes = BatchShapes(max_batch_samples=128, max_batch_tokens=2048, buckets=False)
    with pytest.raises(ValueError, match="max_batch_delay_ms 800 leaves no time within request_timeout_s 0.5"):
        serving_settings(read_config(tmp_path / "model"), shapes, 0.0, 64, 30.0)


def test_a_bad_config_at_startup_stops_only_its_own_model(tiny_artifact: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A 2,000-deep list raised RecursionError out of the first scan, which ended the repository task: no model was
    served and none was after the file was fixed. Now the other model serves from the start, the broken one says why,
    and serves once its file is fixed; an unchanged file is parsed once, however many scans run."""
    repository = tmp_path / "repository"
    copy_version(tiny_artifact, repository, "broken", "1")
    copy_version(tiny_artifact, repository, "fine", "1")
    config = repository / "broken" / "config.yaml"
    config.write_text("version_policy: {all: " + "[" * 2000 + "]" * 2000 + "}\n")
    (repository / "fine" / "config.yaml").write_text("max_queue: 8\n")
    reads: list[str] = []
    original = repository_module.read_config

    def counted(model_dir: Path, root: Path | None = None) -> object:
        reads.append(model_dir.name)
        return original(model_dir, root)

    monkeypatch.setattr(repository_module, "read_config", counted)
    scans_done: list[int] = []
    scan = repository_module.ModelRepository.scan

    async def counted_scan(self: repository_module.ModelRepository) -> None:
        await scan(self)
        scans_done.append(1)

    monkeypatch.setattr(repository_module.ModelRepository, "scan", counted_scan)
    with serve(settings_for(repository, tmp_path, poll_interval_s=0.1, default_model="fine")) as running:
        pixels = {"inputs": [{"pixels": [[0.5] * 28] * 28}]}
        assert httpx.post(f"{running.url}/predict", json={**pixels, "model": "fine"}).status_code == 200
        broken = httpx.get(f"{running.url}/models/broken").json()
        assert "nested deeper than 8 levels" in broken["config_error"]
        assert broken["versions"][0]["state"] == "unavailable"
        scans = running.app_state.repository
        wait_for(lambda: reads.count("fine") >= 1 and len(reads) >= 2, "both files read")
        before, scanned = len(reads), len(scans_done)
        wait_for(lambda: len(scans_done) >= scanned + 5, "five more scans")
        assert len(reads) == before and reads.count("fine") == 1  # neither file changed: neither parsed again
        staged = tmp_path / "config.yaml.new"
        staged.write_text("max_queue: 4\n")
        staged.replace(config)
        wait_for(lambda: httpx.get(f"{running.url}/models/broken").json()["versions"][0]["state"] == "ready",
                 "the fixed model to load")
        assert httpx.post(f"{running.url}/predict", json={**pixels, "model": "broken"}).status_code == 200
        assert scans.configs["broken"].max_queue == 4
