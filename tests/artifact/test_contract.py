"""The artifact contract: every committed manifest reads back key for key, and a manifest that breaks the contract
is refused with the field named."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from artifact.contract import (
    MANIFEST,
    ImageInput,
    ManifestError,
    TextInput,
    is_published,
    parse_manifest,
    read_document,
    retired_folder,
    staging_folder,
    verify_files,
)

REPOSITORY = Path(__file__).resolve().parents[2] / "model_repository"
COMMITTED = sorted(REPOSITORY.glob(f"*/*/{MANIFEST}"))


@pytest.fixture(scope="module")
def image_document() -> dict[str, Any]:
    return read_document(REPOSITORY / "fashion-vit" / "1")


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: f"{p.parent.parent.name}/{p.parent.name}")
def test_committed_manifests_round_trip(path: Path) -> None:
    document = json.loads(path.read_text())
    manifest = parse_manifest(document)
    assert manifest.document() == document
    assert list(manifest.document()) == list(document)  # same keys in the same order
    assert isinstance(manifest.input, TextInput if document["modality"] == "text" else ImageInput)
    assert verify_files(path.parent, manifest) == []


def test_every_committed_modality_is_covered() -> None:
    assert {json.loads(p.read_text())["modality"] for p in COMMITTED} == {"image", "text"}


def test_unknown_major_version_is_refused_and_a_newer_minor_is_read(image_document: dict[str, Any]) -> None:
    with pytest.raises(ManifestError, match=r"unsupported format_version 2\.0 \(this build reads 1\.x\)"):
        parse_manifest({**image_document, "format_version": "2.0", "labels": None})  # the version is the reason
    with pytest.raises(ManifestError, match="unreadable format_version"):
        parse_manifest({**image_document, "format_version": "one"})
    newer = parse_manifest({**image_document, "format_version": "1.99", "added_in_1_99": {"x": 1}})
    assert newer.document()["added_in_1_99"] == {"x": 1}


def test_missing_and_wrong_fields_are_named(image_document: dict[str, Any]) -> None:
    with pytest.raises(ManifestError, match="^manifest lacks labels, sampling$"):
        parse_manifest({k: v for k, v in image_document.items() if k not in ("labels", "sampling")})
    without_height = copy.deepcopy(image_document)
    del without_height["input"]["height"]
    with pytest.raises(ManifestError, match="^manifest lacks input.height$"):
        parse_manifest(without_height)
    with pytest.raises(ManifestError, match="manifest modality: Input should be 'image' or 'text'"):
        parse_manifest({**image_document, "modality": "audio"})
    with pytest.raises(ManifestError, match="input.tokenizer"):  # an image section read as the text model's
        parse_manifest({**image_document, "modality": "text"})
    with pytest.raises(ManifestError, match="ood.thresholds"):
        parse_manifest({**image_document, "ood": {**image_document["ood"], "thresholds": {}}})
    with pytest.raises(ManifestError, match="files do not list director.ts"):
        parse_manifest({**image_document, "files": {}})
    with pytest.raises(ManifestError, match="files.director.ts.sha256"):
        parse_manifest({**image_document, "files": {"director.ts": {"sha256": "not hex"}}})
    with pytest.raises(ManifestError, match="not a JSON object"):
        parse_manifest([image_document])


def test_digest_mismatch_and_missing_file_are_reported(tmp_path: Path) -> None:
    folder = tmp_path / "fashion-vit" / "1"
    shutil.copytree(REPOSITORY / "fashion-vit" / "1", folder)
    manifest = parse_manifest(read_document(folder))
    assert verify_files(folder, manifest) == []
    with (folder / "director.ts").open("r+b") as handle:
        first = handle.read(1)
        handle.seek(0)
        handle.write(bytes([first[0] ^ 1]))
    assert verify_files(folder, manifest) == ["director.ts"]
    (folder / "director.ts").unlink()
    assert verify_files(folder, manifest) == ["director.ts"]


def test_staged_and_retired_versions_are_not_published(tmp_path: Path) -> None:
    version = tmp_path / "model" / "3"
    for folder in (version, staging_folder(version), retired_folder(version)):
        folder.mkdir(parents=True)
    assert is_published(version) and is_published(version.parent)
    assert staging_folder(version).parent == retired_folder(version).parent == version.parent
    assert not is_published(staging_folder(version)) and not is_published(retired_folder(version))
    assert not is_published(tmp_path / "model" / "absent")


def test_the_depth_has_one_name_for_readers(image_document: dict[str, Any]) -> None:
    """Older manifests wrote the depth as ``sampling.steps`` (alone or beside ``depth``): it reads as ``depth`` and
    the document stays as written; two different values are refused."""
    older = copy.deepcopy(image_document)
    older["sampling"].pop("depth", None)
    older["sampling"]["steps"] = 3
    manifest = parse_manifest(older)
    assert manifest.sampling.depth == 3 and manifest.document() == older
    both = copy.deepcopy(image_document)
    both["sampling"].update(steps=2, depth=1)
    with pytest.raises(ValueError, match="steps"):
        parse_manifest(both)


def test_a_multi_label_manifest_names_its_task_and_thresholds(image_document: dict[str, Any]) -> None:
    assert parse_manifest(image_document).task == "single_label"  # manifests before 1.7: single-label
    labels = image_document["labels"]
    section = {"thresholds": [0.5] * len(labels), "threshold_rule": "fixed"}
    base = {k: v for k, v in image_document.items() if k != "conformal"}
    manifest = parse_manifest({**base, "format_version": "1.7", "task": "multi_label", "multi_label": section})
    assert manifest.task == "multi_label" and manifest.multi_label is not None
    assert manifest.document()["multi_label"] == section
    with pytest.raises(ManifestError, match="task multi_label needs the multi_label section"):
        parse_manifest({**base, "task": "multi_label"})
    with pytest.raises(ManifestError, match="2 multi_label thresholds for"):
        parse_manifest({**base, "task": "multi_label", "multi_label": {**section, "thresholds": [0.5, 0.5]}})
    with pytest.raises(ManifestError, match=r"multi_label.*in \(0, 1\)"):
        parse_manifest({**base, "task": "multi_label",
                        "multi_label": {**section, "thresholds": [1.0] * len(labels)}})
    with pytest.raises(ManifestError, match="multi_label is for task multi_label only"):
        parse_manifest({**base, "multi_label": section})
    with pytest.raises(ManifestError, match="task"):
        parse_manifest({**base, "task": "regression"})


def test_a_multi_label_label_recall_file_must_be_digest_checked(image_document: dict[str, Any]) -> None:
    """Format 1.8: the label sets' file is named by ``multi_label.recall`` and must be among ``files``."""
    base = {k: v for k, v in image_document.items() if k != "conformal"}
    recall = {"n": 40, "entries": 55, "split": "40 validation inputs"}
    section = {"thresholds": [0.5] * len(base["labels"]), "threshold_rule": "fixed", "recall": recall}
    with pytest.raises(ManifestError, match="files do not list label_recall.json"):
        parse_manifest({**base, "task": "multi_label", "multi_label": section})
    files = {**base["files"], "label_recall.json": {"sha256": "0" * 64, "bytes": 10}}
    manifest = parse_manifest({**base, "task": "multi_label", "multi_label": section, "files": files})
    assert manifest.multi_label is not None and manifest.multi_label.recall is not None
    assert manifest.multi_label.recall.file == "label_recall.json" and manifest.multi_label.recall.coverage_range == (
        0.5, 0.999)
