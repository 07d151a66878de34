"""Per-model settings (``service.engine.model_settings``): a model's ``config.yaml`` over the server's settings, read
by the repository, used by batching and the predictor, and shown by ``/models`` and Triton's config."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from service.engine.model_settings import (
    ModelConfigFile,
    VersionPolicy,
    check_sampling,
    read_config,
    serving_settings,
)
from service.engine.repository import version_key
from service.engine.shapes import BatchShapes
from tests.service.conftest import copy_version, serve, settings_for, wait_for


def test_the_file_is_validated_key_by_key(tmp_path: Path) -> None:
    assert read_config(tmp_path) is None
    (tmp_path / "config.yaml").write_text("max_queue: 8\nversion_policy: {latest: 2}\n")
    config = read_config(tmp_path)
    assert config is not None and config.given() == {"max_queue": 8, "version_policy": {"latest": 2}}
    for text, message in [("max_qeue: 8\n", "max_qeue: Extra inputs are not permitted"),
                          ("max_queue: '8'\n", "max_queue: Input should be a valid integer"),
                          ("max_queue: 0\n", "max_queue: Input should be greater than or equal to 1"),
                          ("version_policy: {latest: 1, all: {}}\n", "exactly one of latest, specific and all"),
                          ("default_samples: 8\nmax_samples: 4\n", "default_samples 8 is above max_samples 4"),
                          ("max_queue: [\n", "is not YAML")]:
        (tmp_path / "config.yaml").write_text(text)
        with pytest.raises(ValueError, match="config.yaml") as error:
            read_config(tmp_path)
        assert message in str(error.value), (text, str(error.value))


def test_settings_merge_and_policies() -> None:
    shapes = BatchShapes(max_batch_samples=128, max_batch_tokens=2048, buckets=False)
    plain = serving_settings(None, shapes, 0.0, 256, 30.0)
    assert (plain.max_batch_samples, plain.max_queue, plain.instances, plain.default_samples) == (128, 256, 1, None)
    assert plain.version_policy == {"all": {}}
    file = ModelConfigFile(max_batch_samples=32, request_timeout_s=5.0, instances=2, max_samples=8,
                           version_policy=VersionPolicy(specific=[1, "3"]))
    merged = serving_settings(file, shapes, 0.0, 256, 30.0)
    assert (merged.max_batch_samples, merged.max_batch_tokens, merged.request_timeout_s, merged.instances) == (
        32, 2048, 5.0, 2)
    assert merged.version_policy == {"specific": {"versions": ["1", "3"]}}
    versions = ["1", "2", "3", "10"]
    assert VersionPolicy(latest=2).selects(versions, version_key) == {"10", "3"}
    assert VersionPolicy(specific=[1, 3, 7]).selects(versions, version_key) == {"1", "3"}
    assert VersionPolicy(all={}).selects(versions, version_key) == set(versions)
    check_sampling(merged, manifest_default=1, manifest_max=64)
    with pytest.raises(ValueError, match="above the manifest's sampling.max_samples 4"):
        check_sampling(merged, manifest_default=1, manifest_max=4)


def test_a_models_config_is_served_shown_and_reloaded(tiny_artifact: Path, tmp_path: Path) -> None:
    repository = tmp_path / "repository"
    for version in ("1", "2"):
        copy_version(tiny_artifact, repository, "tiny", version)
    config = repository / "tiny" / "config.yaml"
    config.write_text("default_samples: 2\nmax_samples: 4\nmax_queue: 3\ninstances: 2\nmax_batch_delay_ms: 1\n"
                      "version_policy: {latest: 1}\n")
    settings = settings_for(repository, tmp_path, poll_interval_s=0.2)
    with serve(settings) as running:
        models = httpx.get(f"{running.url}/models").json()["models"]
        tiny = next(model for model in models if model["name"] == "tiny")
        assert [v["version"] for v in tiny["versions"]] == ["2"]  # latest: 1
        assert tiny["config"]["max_queue"] == 3 and tiny["config_error"] is None
        version = tiny["versions"][0]
        assert (version["default_samples"], version["max_samples"]) == (2, 4)
        assert version["serving"]["max_queue"] == 3 and version["serving"]["instances"] == 2
        answer = httpx.post(f"{running.url}/predict", json={"inputs": [{"pixels": [[0.5] * 28] * 28}]}).json()
        assert answer["n_samples"] == 2 and answer["model_version"] == "2"
        refused = httpx.post(f"{running.url}/predict", json={"inputs": [{"pixels": [[0.5] * 28] * 28}],
                                                             "n_samples": 5})
        assert refused.status_code == 422 and "between 1 and 4" in refused.json()["error"]
        triton = httpx.get(f"{running.url}/v2/models/tiny/config").json()
        assert triton["version_policy"] == {"latest": {"num_versions": 1}}
        assert triton["dynamic_batching"]["default_queue_policy"]["max_queue_size"] == 3
        assert triton["instance_group"][0]["count"] == 2
        assert triton["parameters"]["n_samples_default"]["string_value"] == "2"
        worker = running.app_state.repository.default_version("tiny").worker
        assert worker is not None and worker.max_queue == 3 and len(worker._tasks) == 2

        # a typo: the serving version keeps its settings and says why it did not change (as for a broken artifact
        # file), and the version the policy no longer hides cannot load. Written whole (a rename), or a poll between
        # the truncation and the write could read an empty config that loads every version
        staged = tmp_path / "config.yaml.new"
        staged.write_text("max_qeue: 3\n")
        staged.replace(config)

        def refused_with_reason() -> bool:  # the whole rescan seen: it publishes the model's error, then each version's
            listed = httpx.get(f"{running.url}/models/tiny").json()
            return (listed["config_error"] is not None and len(listed["versions"]) == 2
                    and listed["versions"][1]["reload_error"] is not None)

        wait_for(refused_with_reason, "the bad config refused with its reason")
        listed = httpx.get(f"{running.url}/models/tiny").json()
        typo = "max_qeue: Extra inputs are not permitted"
        first, second = listed["versions"]
        assert first["state"] == "unavailable" and typo in first["reason"]
        assert second["state"] == "ready" and typo in second["reload_error"] and second["serving"]["max_queue"] == 3
        config.unlink()  # back to the server's settings: every version serves again

        def both_ready() -> bool:
            listed = httpx.get(f"{running.url}/models/tiny").json()
            return [(v["state"], v["reload_error"], v["serving"]["default_samples"]) for v in listed["versions"]
                    if v["serving"]] == [("ready", None, None)] * 2

        wait_for(both_ready, "both versions ready")
        answer = httpx.post(f"{running.url}/predict", json={"inputs": [{"pixels": [[0.5] * 28] * 28}]}).json()
        manifest_default = running.app_state.repository.default_version("tiny").artifact.default_samples
        assert answer["n_samples"] == manifest_default


def test_a_config_replaced_while_a_scan_reads_it_is_applied_by_the_next_scan(
        tiny_artifact: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The scan reads the old file, and the new one lands before the scan records what it read: the next scan must see
    a changed file and apply it (a print taken after the read recorded the new file against the old settings, so no
    scan ever applied it: the typo below was never reported)."""
    import service.engine.repository as repository_module

    repository = tmp_path / "repository"
    copy_version(tiny_artifact, repository, "tiny", "1")
    config = repository / "tiny" / "config.yaml"
    config.write_text("max_queue: 3\n")
    replace_during_read = {"armed": False}

    def read_then_replace(model_dir: Path, root: Path | None = None) -> ModelConfigFile | None:
        read = read_config(model_dir, root)
        if replace_during_read["armed"]:
            replace_during_read["armed"] = False
            staged = tmp_path / "config.yaml.new"
            staged.write_text("max_qeue: 3\n")
            staged.replace(config)
        return read

    monkeypatch.setattr(repository_module, "read_config", read_then_replace)
    with serve(settings_for(repository, tmp_path, poll_interval_s=0.2)) as running:
        replace_during_read["armed"] = True
        touched = tmp_path / "config.yaml.touched"  # the same settings written again: a changed print, so a read
        touched.write_text("max_queue: 3\n")
        touched.replace(config)

        def reported() -> bool:
            listed = httpx.get(f"{running.url}/models/tiny").json()
            return listed["config_error"] is not None and listed["versions"][0]["reload_error"] is not None

        wait_for(reported, "the config error reported", timeout_s=30.0)
        version = httpx.get(f"{running.url}/models/tiny").json()["versions"][0]
        assert "max_qeue: Extra inputs are not permitted" in version["reload_error"]
        assert version["state"] == "ready"
