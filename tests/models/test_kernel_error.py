"""The artifact's kernel error: ``scored_rows`` returns the rows ``sample_rows`` draws under the same seed and, per
input, the kernel's squared mean error against the backbone's own next state exactly as the evaluation's diagnostic
measures it (``training.posthoc.rollout_diagnostics.error_and_variance``), scripted, for images and texts, at
partial and whole-stack depth; padding a text does not move it."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

from models.backbones import VitConfig, build_vit
from models.bert_view import BertTransitionView
from models.director import ImageDirector, StochasticRollout
from models.half_storage import HalfStoredLinear
from models.kernel import TransitionKernel
from models.text_director import fold_for_artifact, text_director_from_view
from models.vit_view import VitTransitionView
from tests.models.test_bert_view import _padded_batch, _tiny_classifier
from training.posthoc.rollout_diagnostics import error_and_variance
from training.posthoc.writing import script_module

pytestmark = pytest.mark.usefixtures("one_thread")


def lively_kernel(dim: int, heads: int, depth: int) -> TransitionKernel:
    """A kernel whose mean map is not the identity, so its error is not the backbone's own step."""
    kernel = TransitionKernel(dim, heads, depth, logvar_init=math.log(0.05))
    with torch.no_grad():
        kernel.adaLN_modulation[-1].weight.normal_(std=0.1)
        kernel.mean_head.weight.normal_(std=0.1)
    return kernel


@pytest.mark.parametrize("depth", [1, 3])
def test_image_scored_rows_give_the_diagnostics_error_and_the_same_rows(depth: int) -> None:
    torch.manual_seed(0)
    view = VitTransitionView(build_vit(VitConfig(stem_channels=[8, 16], embed_dim=16, depth=3, num_heads=2)).eval())
    director = ImageDirector(view.embedding, StochasticRollout(lively_kernel(16, 2, depth)), view.readout_head,
                             view.prefix(3 - depth)).eval().requires_grad_(False)
    pixels = torch.rand(3, 1, 28, 28)  # [3, 1, 28, 28]
    expected = error_and_variance(director, view, (pixels,))[:, 0]  # [3]
    director.rollout.set_teacher(copy.deepcopy(view.teacher_steps(depth)))
    scripted = script_module(director)
    repeats = torch.tensor([2, 1, 3])
    torch.manual_seed(1)
    rows, scores = scripted.scored_rows(pixels, repeats)  # [6, 10], [3, 1]: no feature scorer, the error alone
    error = scores[:, 0]
    assert scores.shape == (3, 1)
    torch.manual_seed(1)
    torch.testing.assert_close(rows, scripted.sample_rows(pixels, repeats))
    torch.testing.assert_close(error, expected, rtol=1e-4, atol=1e-8)
    assert bool((error > 0).all())


@pytest.mark.parametrize("depth", [1, 2])
def test_text_scored_rows_give_the_diagnostics_error_whatever_the_padding(depth: int) -> None:
    view = BertTransitionView(_tiny_classifier(seed=0))
    torch.manual_seed(0)
    director = text_director_from_view(view, lively_kernel(view.dim, view.num_heads, depth)).eval()
    ids, mask = _padded_batch([5, 9, 3], 100, seed=2)  # [3, 9] each
    expected = error_and_variance(director, view, (ids, mask))[:, 0]  # [3]
    director.rollout.set_teacher(view.teacher_steps(depth))  # before folding, as the exporter does
    artifact = fold_for_artifact(director, "float32", max_positions=64)
    scripted = script_module(artifact)
    ones = torch.ones(3, dtype=torch.long)
    error = scripted.scored_rows(ids, mask, ones)[1][:, 0]
    torch.testing.assert_close(error, expected, rtol=1e-4, atol=1e-8)
    wider = torch.cat([ids, torch.zeros(3, 4, dtype=torch.long)], dim=1)  # [3, 13] four more padding columns
    padded_error = scripted.scored_rows(wider, torch.cat([mask, torch.zeros(3, 4, dtype=torch.long)], 1), ones)[1]
    torch.testing.assert_close(padded_error[:, 0], error, rtol=1e-4, atol=1e-8)


def test_a_half_precision_text_artifact_stores_the_teacher_in_half_too() -> None:
    view = BertTransitionView(_tiny_classifier(seed=0))
    torch.manual_seed(0)
    director = text_director_from_view(view, lively_kernel(view.dim, view.num_heads, 1)).eval()
    director.rollout.set_teacher(view.teacher_steps(1))
    ids, mask = _padded_batch([5, 9, 3], 100, seed=2)  # [3, 9] each
    expected = error_and_variance(director, view, (ids, mask))[:, 0]  # [3]
    artifact = fold_for_artifact(director, "float32", max_positions=64, layer_dtype="float16")
    linears = [m for m in artifact.rollout.teacher.modules() if isinstance(m, (nn.Linear, HalfStoredLinear))]
    assert linears and all(isinstance(m, HalfStoredLinear) for m in linears)
    error = script_module(artifact).scored_rows(ids, mask, torch.ones(3, dtype=torch.long))[1][:, 0]
    torch.testing.assert_close(error, expected, rtol=2e-2, atol=1e-6)  # half-precision weights move it a little


def test_a_rollout_without_the_teacher_refuses_to_score_and_a_wrong_teacher_is_refused() -> None:
    torch.manual_seed(0)
    view = VitTransitionView(build_vit(VitConfig(stem_channels=[8, 16], embed_dim=16, depth=3, num_heads=2)).eval())
    rollout = StochasticRollout(lively_kernel(16, 2, 1))
    director = ImageDirector(view.embedding, rollout, view.readout_head, view.prefix(2)).eval()
    with pytest.raises(RuntimeError, match="no teacher"):
        director.scored_rows(torch.rand(1, 1, 28, 28), torch.tensor([1]))
    with pytest.raises(ValueError, match="the kernel diffuses 1"):
        rollout.set_teacher(view.teacher_steps(2))
    assert not rollout.has_teacher
