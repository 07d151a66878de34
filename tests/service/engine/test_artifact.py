"""One artifact folder (``service.engine.artifact``) on tiny scripted modules in a temp folder: what a manifest must
keep, which temperature and OOD rule it gives, what ``load_artifact`` refuses and with which reason, and what the
warm-up runs."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from artifact.contract import ARTIFACT, MANIFEST, TOKENIZER, Ood, sha256_file
from models.uncertainty import ScoreTemperature
from service.engine.artifact import (
    Artifact,
    ArtifactError,
    OodRule,
    error_line,
    input_score_names,
    load_artifact,
    manifest_temperature,
    ood_rule,
    read_manifest,
    uses_input_scores,
    validate_manifest,
    warm_up,
)
from service.engine.device import Device
from service.engine.modalities.image import ImageDecoder, ImageRunner
from service.engine.shapes import BatchShapes, warm_counts
from tests.service.engine.scripted import (
    LABELS,
    SHAPE,
    ScoredDirector,
    TinyDirector,
    manifest_document,
    write_version,
)

CPU = Device(torch.device("cpu"))
KERNEL_RULE = {"thresholds": {"2": {"score": "kernel_error", "threshold": 0.5}}}
COMPILED = {"device": "cuda", "methods": ["sample_rows"]}


def listed(**changes: Any) -> dict[str, Any]:
    """A manifest document whose files list director.ts (any digest: validation does not read files)."""
    return manifest_document(files={ARTIFACT: {"sha256": "0" * 64}}, **changes)


def test_read_manifest_names_what_is_wrong_with_the_file(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match="manifest.json is missing"):
        read_manifest(tmp_path)
    (tmp_path / MANIFEST).write_text("{not json")
    with pytest.raises(ArtifactError, match="not valid JSON"):
        read_manifest(tmp_path)
    (tmp_path / MANIFEST).write_text("[1, 2]")
    with pytest.raises(ArtifactError, match="not a JSON object"):
        read_manifest(tmp_path)
    (tmp_path / MANIFEST).write_text(json.dumps({"name": "shown as written"}))
    assert read_manifest(tmp_path) == {"name": "shown as written"}  # read, not validated


@pytest.mark.parametrize(("changes", "reason"), [
    ({"ood": {"thresholds": {"2": {"score": "combined", "threshold": 0.0}},
              "combination": [{"score": "vibes", "weight": 1.0, "center": 0.0, "scale": 1.0}]}},
     "bad ood.combination term: score 'vibes'"),
    ({"temperature_by_score": {"slope": 1.0,
                               "terms": [{"score": "energy", "weight": 1.0, "center": 0.0, "scale": 1.0}]}},
     "bad temperature_by_score term: score 'energy'"),
    ({"ood": {"thresholds": {"2": {"score": "mds", "threshold": 1.0}}}},
     r"use mds, which the artifact's scored_rows does not return \(artifact.input_scores: \['kernel_error'\]\)"),
    ({"ood": {"thresholds": {"2": {"score": "knn", "threshold": 1.0}}}, "artifact": {"input_scores": ["mds"]}},
     "use knn"),
])
def test_a_manifest_naming_a_score_the_server_does_not_compute_is_refused(changes: dict[str, Any], reason: str
                                                                          ) -> None:
    with pytest.raises(ArtifactError, match=reason):
        validate_manifest(listed(**changes))


def test_the_per_input_scores_and_the_temperature_a_manifest_gives() -> None:
    plain = validate_manifest(listed(temperature=1.5))
    assert input_score_names(plain) == ("kernel_error",)  # an artifact from before feature-space scores
    assert manifest_temperature(plain) == 1.5 and not uses_input_scores(plain)
    assert uses_input_scores(validate_manifest(listed(ood=KERNEL_RULE)))
    feature = validate_manifest(listed(artifact={"input_scores": ["kernel_error", "mds"]},
                                       ood={"thresholds": {"2": {"score": "mds", "threshold": 1.0}}}))
    assert input_score_names(feature) == ("kernel_error", "mds") and uses_input_scores(feature)
    term = {"score": "kernel_error", "weight": 2.0, "center": 0.5, "scale": 1.0}
    by_score = validate_manifest(listed(temperature=1.5, temperature_by_score={"slope": 0.5, "terms": [term]}))
    temperature = manifest_temperature(by_score)
    assert isinstance(temperature, ScoreTemperature) and uses_input_scores(by_score)
    assert (temperature.base, temperature.slope, temperature.terms[0].weight) == (1.5, 0.5, 2.0)
    # base * exp(slope * max(0, weight * (score - center))): 1.5 below the center, 1.5 e^0.5 one unit above it
    values = temperature({"kernel_error": torch.tensor([0.0, 1.0])}).tolist()
    assert values == pytest.approx([1.5, 1.5 * math.exp(0.5)])


def test_a_combined_score_reads_per_input_scores_only_through_its_terms() -> None:
    def combined(score: str) -> dict[str, Any]:
        return {"thresholds": {"2": {"score": "combined", "threshold": 0.0}},
                "combination": [{"score": "energy", "weight": 1.0, "center": 0.0, "scale": 1.0},
                                {"score": score, "weight": 1.0, "center": 0.0, "scale": 1.0}]}

    assert not uses_input_scores(validate_manifest(listed(ood=combined("max_softmax"))))
    assert uses_input_scores(validate_manifest(listed(ood=combined("kernel_error"))))
    rule = ood_rule(validate_manifest(listed(ood=combined("kernel_error"))).ood, 2)
    assert [term.score for term in rule.terms] == ["energy", "kernel_error"]


def test_scores_relative_to_the_threshold_are_one_at_it_whatever_its_sign() -> None:
    assert OodRule("energy", -2.0, 2).relative([-2.0, -1.0, -4.0]) == [1.0, 1.5, 0.0]
    assert OodRule("mds", 200.0, 2).relative([200.0, 300.0]) == [1.0, 1.5]
    assert OodRule("energy", 0.0, 2).relative([0.0])[0] == 1.0  # a threshold of 0 divides by nothing


def test_the_nearest_threshold_ties_to_the_lower_sample_count() -> None:
    ood = Ood(thresholds={"2": {"score": "energy", "threshold": -1.0}, "6": {"score": "energy", "threshold": -2.0}})
    rule = ood_rule(ood, 4)
    assert (rule.calibrated_samples, rule.threshold) == (2, -1.0)
    assert rule.note is not None and "n_samples=4" in rule.note and "n_samples=2" in rule.note


def test_a_scripted_version_loads_and_runs_its_rows(tmp_path: Path) -> None:
    artifact = load_artifact(write_version(tmp_path / "1", temperature=2.0), CPU)
    assert (artifact.labels, artifact.default_samples, artifact.max_samples, artifact.modality) == (
        LABELS, 2, 8, "image")
    assert artifact.temperature == 2.0 and artifact.decisions is None and not artifact.scored
    assert isinstance(artifact.decoder, ImageDecoder) and artifact.decoder.shape == SHAPE
    rows, scores = artifact.rows(torch.full((2, *SHAPE), 0.5), torch.tensor([1, 3]))
    assert scores is None and artifact.named_scores(scores) is None
    assert rows.tolist() == [[0.5, -0.5]] * 4  # mean pixel times the weight [1, -1], 1 + 3 rows in input order


def test_a_kernel_error_alone_becomes_one_named_column(tmp_path: Path) -> None:
    artifact = load_artifact(write_version(tmp_path / "1", ScoredDirector(), ood=KERNEL_RULE), CPU)
    assert artifact.scored
    pixels = torch.stack([torch.full(SHAPE, 0.25), torch.full(SHAPE, 0.75)])  # [2, C, H, W]
    rows, scores = artifact.rows(pixels, torch.tensor([2, 1]))
    assert rows.shape == (3, 2) and scores is not None and scores.shape == (2, 1)  # [B] -> [B, 1]
    named = artifact.named_scores(scores)
    assert named is not None and {name: s.tolist() for name, s in named.items()} == {"kernel_error": [0.25, 0.75]}


class FailingDirector(torch.nn.Module):
    @torch.jit.export
    def sample_rows(self, pixels: torch.Tensor, repeats: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("no forward today")


def corrupt_file(folder: Path) -> None:
    (folder / ARTIFACT).write_bytes(b"not a zip archive")
    relist(folder)


def edit_after_listing(folder: Path) -> None:
    with (folder / ARTIFACT).open("ab") as handle:
        handle.write(b"\0")


def junk_tokenizer(folder: Path) -> None:
    (folder / TOKENIZER).write_text("{}")
    relist(folder)


def relist(folder: Path) -> None:
    """The manifest's files listed again with their current digests."""
    document = json.loads((folder / MANIFEST).read_text())
    for name in [ARTIFACT, *([TOKENIZER] if (folder / TOKENIZER).exists() else [])]:
        document["files"][name] = {"sha256": sha256_file(folder / name)}
    (folder / MANIFEST).write_text(json.dumps(document))


TEXT_INPUT = {"tokenizer": TOKENIZER, "max_length": 8, "max_characters": 100, "padding": {"pad_id": 0}}
REFUSALS: list[tuple[Any, dict[str, Any], Any, str]] = [  # module, manifest changes, edit after writing, reason
    (None, {}, edit_after_listing, "sha256 mismatch or missing file: director.ts"),
    (None, {}, corrupt_file, "torch.jit.load failed"),
    (None, {"files": {"../outside.bin": {"sha256": "0" * 64}}}, None,
     "files that resolve outside the version folder .*'../outside.bin'"),
    (None, {"files": {"/etc/hostname": {"sha256": "0" * 64}}}, None, "outside the version folder .*: an absolute path"),
    (None, {"artifact": {"format": "onnx"}}, None, "artifact.format 'onnx' is not a format this server runs"),
    (None, {"artifact": {"format": "aoti", "file": "director.pt2", "compiled": COMPILED}}, None,
     "files do not list the package 'director.pt2'"),
    (None, {"artifact": {"format": "aoti", "file": ARTIFACT}}, None, "needs artifact.compiled"),
    (None, {"artifact": {"format": "aoti", "file": ARTIFACT, "compiled": COMPILED}}, None,
     "compiled for cuda; this server runs on cpu"),
    (TinyDirector(labels=3), {}, None, r"warm-up returned shape \(3, 3\), expected \(3, 2\)"),
    (TinyDirector(scale=math.nan), {}, None, "warm-up returned non-finite logits"),
    (FailingDirector(), {}, None, "warm-up forward failed: .*no forward today"),
    (TinyDirector(), {"ood": KERNEL_RULE}, None, "needs per-input scores but the artifact has no scored_rows"),
    (ScoredDirector(), {"ood": KERNEL_RULE, "artifact": {"input_scores": ["kernel_error", "mds"]}}, None,
     r"per-input scores of shape \(2, 1\) or non-finite, expected \(2, 2\)"),
    (None, {"modality": "text", "input": TEXT_INPUT}, junk_tokenizer, "tokenizer.json is not a tokenizers file"),
]


@pytest.mark.parametrize(("module", "changes", "edit", "reason"), REFUSALS)
def test_a_version_that_cannot_serve_is_refused_with_the_reason(tmp_path: Path, module: Any, changes: dict[str, Any],
                                                                edit: Any, reason: str) -> None:
    folder = write_version(tmp_path / "1", module, **changes)
    if edit is not None:
        edit(folder)
    with pytest.raises(ArtifactError, match=reason):
        load_artifact(folder, CPU)


class RecordingModule:
    """Records (inputs, rows) of every forward; logits are zeros."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    def sample_rows(self, pixels: torch.Tensor, repeats: torch.Tensor) -> torch.Tensor:
        self.calls.append((int(pixels.shape[0]), int(repeats.sum())))
        return torch.zeros(int(repeats.sum()), len(LABELS))  # [rows, C]


def test_with_shape_buckets_the_warm_up_runs_every_bucket_three_times(tmp_path: Path) -> None:
    module = RecordingModule()
    artifact = Artifact(tmp_path, validate_manifest(listed()), module,  # type: ignore[arg-type]
                        ImageDecoder(SHAPE), ImageRunner(SHAPE))
    warm_up(artifact, Device(torch.device("cpu"), shapes=BatchShapes(4, 2048, buckets=True)))
    buckets = [(1, 1), (1, 2), (2, 2), (1, 4), (4, 4)]
    assert list(warm_counts(4)) == buckets
    assert module.calls == [(2, 3), *(shape for shape in buckets for _ in range(3))]  # 1 + default_samples rows
    module.calls.clear()
    warm_up(artifact, CPU)  # no buckets: the one example forward
    assert module.calls == [(2, 3)]


def test_an_error_line_is_the_last_line_of_a_script_traceback() -> None:
    assert error_line(torch.jit.Error("Traceback of TorchScript\n  at x.py:3\nRuntimeError: bad size\n")) == (
        "RuntimeError: bad size")
    assert error_line(ValueError("two\n lines")) == "ValueError: two lines"


def test_a_missing_module_is_named(tmp_path: Path) -> None:
    folder = write_version(tmp_path / "1")
    (folder / ARTIFACT).unlink()
    with pytest.raises(ArtifactError, match="sha256 mismatch or missing file: director.ts"):
        load_artifact(folder, CPU)
