"""Backbones (``models.backbones``): folding a conv stem's batch norms into its convolutions keeps the classifier's
function, scripted too, and leaves a model that is still training alone."""

from __future__ import annotations

import copy

import torch
from timm.layers import BatchNormAct2d

from models.backbones import VitConfig, build_vit, fold_batch_norms, unfold_batch_norms
from training.posthoc.writing import script_module


def trained_stem_vit() -> torch.nn.Module:
    """A hybrid ViT whose stem's batch norms have running statistics and affine parameters far from their
    initial values (so that folding them is not the identity)."""
    torch.manual_seed(0)
    model = build_vit(VitConfig(stem_channels=[8, 16, 24], embed_dim=24, depth=2, num_heads=2))
    for module in model.modules():
        if isinstance(module, BatchNormAct2d):
            module.running_mean.uniform_(-1, 1)
            module.running_var.uniform_(0.5, 2)
            module.weight.data.uniform_(0.5, 1.5)
            module.bias.data.uniform_(-0.5, 0.5)
    return model.eval()


def test_folding_keeps_the_function() -> None:
    model = trained_stem_vit()
    folded = copy.deepcopy(model)
    assert fold_batch_norms(folded) == 3
    assert not any(isinstance(m, BatchNormAct2d) for m in folded.modules())
    pixels = torch.rand(6, 1, 28, 28)
    with torch.no_grad():
        want = model(pixels)  # [6, 10]
        torch.testing.assert_close(folded(pixels), want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(script_module(folded)(pixels), want, rtol=1e-5, atol=1e-5)
    assert fold_batch_norms(folded) == 0  # nothing left to fold


def test_a_training_model_is_not_folded() -> None:
    model = trained_stem_vit().train()
    assert fold_batch_norms(model) == 0
    assert sum(isinstance(m, BatchNormAct2d) for m in model.modules()) == 3


def test_unfolding_the_weights_of_a_folded_stem_gives_the_same_classifier() -> None:
    """What ``training.restore_run`` does with a committed artifact's backbone: the folded weights, put back in the
    unfolded layout, load key for key into a fresh model that then computes the same logits."""
    model = trained_stem_vit()
    folded = copy.deepcopy(model)
    fold_batch_norms(folded)
    fresh = build_vit(VitConfig(stem_channels=[8, 16, 24], embed_dim=24, depth=2, num_heads=2)).eval()
    fresh.load_state_dict(unfold_batch_norms(folded.state_dict(), fresh))
    pixels = torch.rand(6, 1, 28, 28)
    with torch.no_grad():
        torch.testing.assert_close(fresh(pixels), model(pixels), rtol=1e-5, atol=1e-5)
    assert unfold_batch_norms(model.state_dict(), fresh).keys() == model.state_dict().keys()  # unfolded: unchanged
