"""The hybrid path (``models.hybrid``): its rows are the post-hoc path's to the bit (the backbone's own forward), every
sample the same row; its ``scored_rows`` give the DIRECTOR artifact's own kernel error and feature scores; it scripts,
for images and texts, and a rollout without the backbone's transitions is refused."""

from __future__ import annotations

import pytest
import torch

from models.bert_view import BertTransitionView
from models.director import ImageDirector, StochasticRollout
from models.feature_scores import FEATURE_SCORES, fit_feature_scorer
from models.hybrid import HybridImage, HybridText, hybrid_from_director
from models.posthoc import posthoc_from_director
from models.text_director import fold_for_artifact, text_director_from_view
from tests.models.test_bert_view import _padded_batch, _tiny_classifier
from tests.models.test_feature_scores import director_with_teacher
from tests.models.test_kernel_error import lively_kernel
from training.posthoc.writing import script_module

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_image_hybrid_predicts_the_backbone_and_scores_the_kernel_error() -> None:
    director, view, backbone = director_with_teacher()
    pixels = torch.rand(6, 1, 28, 28)  # [6, 1, 28, 28]
    hybrid = hybrid_from_director(director)
    assert isinstance(hybrid, HybridImage)
    scripted, posthoc = script_module(hybrid), script_module(posthoc_from_director(director))
    repeats = torch.tensor([1, 3, 1, 2, 1, 1])
    rows, scores = scripted.scored_rows(pixels, repeats)  # [9, 10], [6, 1]
    assert torch.equal(rows, posthoc.sample_rows(pixels, repeats))  # the backbone's own logits, to the bit
    assert torch.equal(rows, scripted.sample_rows(pixels, repeats))  # the kernel beside them changes nothing
    with torch.no_grad():
        torch.testing.assert_close(rows[[0, 1, 4, 6, 7, 8]], backbone(pixels), atol=1e-5, rtol=0)
    torch.manual_seed(3)
    _, director_scores = director.scored_rows(pixels, torch.ones(6, dtype=torch.long))  # [6, 1] the kernel error
    torch.testing.assert_close(scores, director_scores, rtol=1e-5, atol=1e-8)
    assert bool((scores[:, 0] > 0).all())
    samples = scripted(pixels, 4)  # [4, 6, 10]
    assert samples.shape == (4, 6, 10) and torch.equal(samples[0], samples[3])


def test_the_text_hybrid_gives_the_same_labels_and_scores_under_padding() -> None:
    view = BertTransitionView(_tiny_classifier(seed=0))
    torch.manual_seed(0)
    director = text_director_from_view(view, lively_kernel(view.dim, view.num_heads, 2)).eval()
    director.rollout.set_teacher(view.teacher_steps(2))
    artifact = fold_for_artifact(director, "float32", max_positions=64)
    hybrid = hybrid_from_director(artifact)
    assert isinstance(hybrid, HybridText)
    scripted, posthoc = script_module(hybrid), script_module(posthoc_from_director(artifact))
    ids, mask = _padded_batch([5, 9, 3], 100, seed=2)  # [3, 9] each
    ones = torch.ones(3, dtype=torch.long)
    rows, scores = scripted.scored_rows(ids, mask, ones)  # [3, C], [3, 1]
    assert torch.equal(rows, posthoc.sample_rows(ids, mask, ones))
    _, director_scores = script_module(artifact).scored_rows(ids, mask, ones)
    torch.testing.assert_close(scores, director_scores, rtol=1e-5, atol=1e-8)
    wider = torch.cat([ids, torch.zeros(3, 4, dtype=torch.long)], dim=1)  # [3, 13] four more padding columns
    wider_mask = torch.cat([mask, torch.zeros(3, 4, dtype=torch.long)], dim=1)
    padded_rows, padded_scores = scripted.scored_rows(wider, wider_mask, ones)
    torch.testing.assert_close(padded_rows, rows, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(padded_scores, scores, rtol=1e-4, atol=1e-8)


def test_the_hybrid_returns_the_feature_scores_after_the_kernel_error() -> None:
    director, view, _ = director_with_teacher()
    pixels = torch.rand(40, 1, 28, 28)
    weight, bias = view.readout_head.final_layer()
    posthoc = posthoc_from_director(director)
    with torch.no_grad():
        features = posthoc.features(director.embedding(pixels), None)  # [40, 16]
    director.feature_scorer = fit_feature_scorer(features, torch.arange(40) % 10, 10, weight, bias, seed=0)
    scripted = script_module(hybrid_from_director(director))
    _, scores = scripted.scored_rows(pixels[:5], torch.ones(5, dtype=torch.long))  # [5, 1 + F]
    assert scores.shape == (5, 1 + len(FEATURE_SCORES))
    torch.testing.assert_close(scores[:, 1:], director.feature_scorer(features[:5]), rtol=1e-3, atol=1e-3)


def test_a_rollout_without_the_backbone_transitions_is_refused() -> None:
    director, view, _ = director_with_teacher()
    bare = ImageDirector(director.embedding, StochasticRollout(lively_kernel(16, 2, 1)), director.readout,
                         director.prefix)
    with pytest.raises(ValueError, match="the backbone's own last transitions"):
        hybrid_from_director(bare)
