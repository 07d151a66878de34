"""A model's ``config.yaml`` (``service.engine.model_settings``) read in-process from a temp folder: the file-level
refusals (aliases, depth, size, emptiness, links, encoding), the version policy's rules and Triton form, and the
checks of the merged settings. tests/service/test_model_settings.py has the key-by-key validation and the served
config."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from service.engine.model_settings import (
    CONFIG_FILE,
    MAX_CONFIG_BYTES,
    ModelConfigFile,
    VersionPolicy,
    check_sampling,
    read_config,
    serving_settings,
)
from service.engine.repository import version_key
from service.engine.shapes import BatchShapes

SHAPES = BatchShapes(max_batch_samples=128, max_batch_tokens=2048, buckets=False)


def model_dir(tmp_path: Path, content: str | bytes | None = None) -> Path:
    folder = tmp_path / "repository" / "tiny"
    folder.mkdir(parents=True, exist_ok=True)
    if isinstance(content, str):
        (folder / CONFIG_FILE).write_text(content)
    elif content is not None:
        (folder / CONFIG_FILE).write_bytes(content)
    return folder


def refused(folder: Path) -> str:
    with pytest.raises(ValueError) as error:
        read_config(folder)
    return str(error.value)


@pytest.mark.parametrize(("content", "reason"), [
    ("max_queue: &n 8\nmax_batch_samples: *n\n", "config.yaml is not YAML: aliases (*name) are not allowed"),
    ("version_policy: {specific: " + "[" * 9 + "1" + "]" * 9 + "}\n", "nested deeper than 8 levels"),
    ("", "config.yaml is empty (write {} for no overrides)"),
    ("# nothing set\n", "config.yaml is empty"),
    ("#" * MAX_CONFIG_BYTES + "\n", "config.yaml is larger than 64 KiB"),
    (b"max_queue: 8 # \xff\n", "config.yaml cannot be read: UnicodeDecodeError"),
    ("max_batch_delay_ms: .inf\n", "max_batch_delay_ms: Input should be a finite number"),
    ("max_queue: true\n", "max_queue: Input should be a valid integer"),
    ("[1, 2]\n", "config.yaml: file: Input should be a valid dictionary"),
])
def test_a_file_that_cannot_be_used_is_refused_with_the_reason(tmp_path: Path, content: str | bytes, reason: str
                                                               ) -> None:
    assert reason in refused(model_dir(tmp_path, content))


def test_deep_but_valid_nesting_and_an_empty_mapping_read(tmp_path: Path) -> None:
    assert read_config(model_dir(tmp_path, "{}\n")).given() == {}  # type: ignore[union-attr]
    config = read_config(model_dir(tmp_path, "version_policy:\n  specific:\n    - 1\n    - 3\n"))
    assert config is not None and config.given() == {"version_policy": {"specific": [1, 3]}}


def test_a_linked_file_must_stay_inside_the_repository(tmp_path: Path) -> None:
    folder = model_dir(tmp_path)
    shared, outside = tmp_path / "repository" / "shared.yaml", tmp_path / "outside.yaml"
    shared.write_text("max_queue: 4\n")
    outside.write_text("max_queue: 4\n")
    (folder / CONFIG_FILE).symlink_to(shared)
    assert read_config(folder).given() == {"max_queue": 4}  # type: ignore[union-attr]
    (folder / CONFIG_FILE).unlink()
    (folder / CONFIG_FILE).symlink_to(outside)
    assert refused(folder) == "config.yaml links outside the model repository"
    assert read_config(folder, root=tmp_path) is not None  # inside the root it is given
    (folder / CONFIG_FILE).unlink()
    (folder / CONFIG_FILE).symlink_to(tmp_path / "missing.yaml")
    assert refused(folder) == "config.yaml cannot be read: FileNotFoundError"  # a dangling link is no "no file"


@pytest.mark.parametrize("versions", [["1.5"], ["-1"], ["\u0661"], ["1" * 19], [], ["x"], [True], [1.0]])
def test_specific_versions_are_whole_ascii_numbers(versions: list[Any]) -> None:
    with pytest.raises(ValidationError):
        VersionPolicy(specific=versions)


def test_a_policy_is_exactly_one_of_three_and_has_a_triton_form() -> None:
    for fields in ({}, {"latest": 1, "specific": [1]}, {"all": {"x": 1}}, {"latest": 0}, {"pinned": [1]},
                   {"latest": True}, {"latest": 2.0}):
        with pytest.raises(ValidationError):
            VersionPolicy.model_validate(fields)
    assert VersionPolicy(latest=2).triton() == {"latest": {"num_versions": 2}}
    assert VersionPolicy(specific=[1, "3"]).triton() == {"specific": {"versions": ["1", "3"]}}
    assert VersionPolicy(all={}).triton() == {"all": {}}


def test_the_latest_versions_are_the_highest_numbers_above_names() -> None:
    versions = ["beta", "2", "10", "9"]
    assert VersionPolicy(latest=2).selects(versions, version_key) == {"10", "9"}
    assert VersionPolicy(latest=5).selects(versions, version_key) == set(versions)
    assert VersionPolicy(specific=["010"]).selects(["10"], version_key) == set()  # names are compared as written


def test_a_delay_that_leaves_no_time_within_the_timeout_is_refused_only_when_the_file_sets_one() -> None:
    file = ModelConfigFile(request_timeout_s=0.5)
    with pytest.raises(ValueError, match="max_batch_delay_ms 500 leaves no time within request_timeout_s 0.5"):
        serving_settings(file, SHAPES, 500.0, 64, 30.0)
    assert serving_settings(file, SHAPES, 499.0, 64, 30.0).request_timeout_s == 0.5
    plain = serving_settings(None, SHAPES, 500.0, 64, 0.5)  # the server's own settings are checked elsewhere
    assert plain.shown() == {"max_batch_samples": 128, "max_batch_tokens": 2048, "max_batch_delay_ms": 500.0,
                             "max_queue": 64, "request_timeout_s": 0.5, "instances": 1, "default_samples": None,
                             "max_samples": None, "version_policy": {"all": {}}}


def test_the_default_sample_count_must_fit_the_maximum_whichever_sets_them() -> None:
    lower_max = serving_settings(ModelConfigFile(max_samples=2), SHAPES, 0.0, 64, 30.0)
    with pytest.raises(ValueError, match="the default sample count 4 is above max_samples 2"):
        check_sampling(lower_max, manifest_default=4, manifest_max=16)  # the manifest's default, the file's max
    higher_default = serving_settings(ModelConfigFile(default_samples=32), SHAPES, 0.0, 64, 30.0)
    with pytest.raises(ValueError, match="the default sample count 32 is above max_samples 16"):
        check_sampling(higher_default, manifest_default=4, manifest_max=16)
    check_sampling(serving_settings(ModelConfigFile(default_samples=16), SHAPES, 0.0, 64, 30.0), 4, 16)
