"""The served artifact (``training.export.final_artifact``): once the manifest's scores are known, the file is
scripted again computing only the per-input scores it reads (none: no teacher transitions), and it agrees with the
file the statistics were measured on; a manifest that reads every score leaves the file as it was."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import torch

from artifact.contract import ARTIFACT
from models.director import ImageDirector
from models.feature_scores import FEATURE_SCORES, fit_feature_scorer
from tests.models.test_feature_scores import director_with_teacher
from training.export.final_artifact import finish_artifact
from training.posthoc.ood_selection import returns_input_scores
from training.posthoc.writing import load_scripted, save_scripted, script_module


def scored_director() -> ImageDirector:
    """A tiny DIRECTOR carrying its teacher transition and every feature score."""
    director, view, _ = director_with_teacher()
    weight, bias = view.readout_head.final_layer()
    director.feature_scorer = fit_feature_scorer(torch.randn(300, 16), torch.arange(300) % 10, 10, weight, bias, seed=0)
    return director


def parts_with(pixels: torch.Tensor) -> SimpleNamespace:
    """What ``finish_artifact`` reads of an export's parts: validation inputs and the artifact details."""
    return SimpleNamespace(data=SimpleNamespace(val=SimpleNamespace(first_args=lambda n: (pixels[:n],))),
                           artifact_details={})


def test_the_served_file_keeps_only_the_scores_the_manifest_reads(tmp_path: Path) -> None:
    director = scored_director()
    save_scripted(script_module(director), tmp_path / ARTIFACT)
    measured = load_scripted(tmp_path / ARTIFACT)  # what the statistics were measured on: every score
    pixels = torch.rand(8, 1, 28, 28)
    finish_artifact(parts_with(pixels), "torchscript", director, measured, {"mds", "energy"}, tmp_path)
    served = load_scripted(tmp_path / ARTIFACT)
    ones = torch.ones(8, dtype=torch.long)
    torch.manual_seed(1)
    rows, scores = measured.scored_rows(pixels, ones)  # [8, 10], [8, 5]
    torch.manual_seed(1)
    kept_rows, kept_scores = served.scored_rows(pixels, ones)  # [8, 10], [8, 2]
    torch.testing.assert_close(kept_rows, rows)
    torch.testing.assert_close(kept_scores, scores[:, :2])  # the kernel error, then mds
    assert served.feature_scorer.bank.numel() == 0


def test_a_manifest_reading_every_score_leaves_the_file_alone(tmp_path: Path) -> None:
    director = scored_director()
    save_scripted(script_module(director), tmp_path / ARTIFACT)
    before = (tmp_path / ARTIFACT).read_bytes()
    everything = {"kernel_error", *FEATURE_SCORES}
    finish_artifact(parts_with(torch.rand(8, 1, 28, 28)), "torchscript", director,
                    load_scripted(tmp_path / ARTIFACT), everything, tmp_path)
    assert (tmp_path / ARTIFACT).read_bytes() == before


def test_a_manifest_reading_no_input_score_drops_the_teacher_transitions(tmp_path: Path) -> None:
    """Energy alone needs neither the kernel error nor the backbone's own features: the served file runs no layer
    beyond the prefix, and its rows are the ones the statistics were measured on."""
    director = scored_director()
    save_scripted(script_module(director), tmp_path / ARTIFACT)
    measured = load_scripted(tmp_path / ARTIFACT)
    pixels = torch.rand(8, 1, 28, 28)
    finish_artifact(parts_with(pixels), "torchscript", director, measured, {"energy"}, tmp_path)
    served = load_scripted(tmp_path / ARTIFACT)
    assert not served.rollout.has_teacher and not returns_input_scores(director)
    assert not any(".teacher." in key or "feature_scorer" in key for key in served.state_dict())
    repeats = torch.tensor([1, 3, 2, 1, 1, 1, 1, 1])
    torch.manual_seed(2)
    expected = measured.sample_rows(pixels, repeats)  # [11, 10]
    torch.manual_seed(2)
    torch.testing.assert_close(served.sample_rows(pixels, repeats), expected)
