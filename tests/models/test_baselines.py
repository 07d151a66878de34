"""Baseline methods behind the artifact contract: shapes, row grouping, dropout surviving eval(), scripting."""

from __future__ import annotations

import pytest
import torch

from models.backbones import ImageClassifier, VitConfig, build_vit
from models.baselines import AlwaysDropout, DeterministicModel, EnsembleModel, MCDropoutModel
from tests.models.scripting import scripted


def tiny_classifier(seed: int, drop_rate: float = 0.0) -> ImageClassifier:
    torch.manual_seed(seed)
    cfg = VitConfig(stem_channels=[8, 16], embed_dim=16, depth=2, num_heads=2, drop_rate=drop_rate,
                    proj_drop_rate=drop_rate)
    return build_vit(cfg).eval()


PIXELS = torch.rand(3, 1, 28, 28)


def test_deterministic_rows_are_the_backbone_logits_repeated() -> None:
    classifier = tiny_classifier(0)
    model = DeterministicModel(classifier).eval()
    expected = classifier(PIXELS)  # [B, C]
    out = model(PIXELS, 4)
    assert out.shape == (4, 3, 10)
    assert torch.equal(out, expected.unsqueeze(0).expand(4, -1, -1))
    rows = model.sample_rows(PIXELS, torch.tensor([1, 3, 2]))
    assert torch.equal(rows, expected[[0, 1, 1, 1, 2, 2]])


def test_mc_dropout_samples_differ_even_after_eval_and_scripting() -> None:
    model = MCDropoutModel(tiny_classifier(0, drop_rate=0.2)).eval()
    assert any(isinstance(m, AlwaysDropout) for m in model.modules())
    for candidate in (model, scripted(model).eval()):
        out = candidate(PIXELS, 5)  # [S, B, C]
        assert out.shape == (5, 3, 10)
        assert not torch.allclose(out[0], out[1])
        torch.manual_seed(7)
        first = candidate.sample_rows(PIXELS, torch.tensor([2, 1, 3]))
        torch.manual_seed(7)
        assert torch.equal(first, candidate.sample_rows(PIXELS, torch.tensor([2, 1, 3])))
        assert first.shape == (6, 10)


def test_mc_dropout_refuses_a_backbone_without_dropout() -> None:
    with pytest.raises(ValueError, match="dropout"):
        MCDropoutModel(tiny_classifier(0, drop_rate=0.0))


def test_ensemble_row_j_of_an_input_is_member_j_mod_m() -> None:
    members = [tiny_classifier(seed) for seed in range(3)]
    model = EnsembleModel(members).eval()
    per_member = torch.stack([m(PIXELS) for m in members])  # [M, B, C]
    rows = model.sample_rows(PIXELS, torch.tensor([4, 1, 2]))
    expected = torch.stack([per_member[0, 0], per_member[1, 0], per_member[2, 0], per_member[0, 0],
                            per_member[0, 1], per_member[0, 2], per_member[1, 2]])
    torch.testing.assert_close(rows, expected)
    out = scripted(model)(PIXELS, 3)  # [S, B, C]
    torch.testing.assert_close(out, per_member)
