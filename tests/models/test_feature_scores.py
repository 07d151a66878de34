"""Feature-space OOD scores (``models.feature_scores``): each column equals its definition computed directly, the
module scripts, and a DIRECTOR carrying a scorer returns the scores of the backbone's own features from
``scored_rows``, beside the kernel error."""

from __future__ import annotations

import copy

import pytest
import torch

from models.backbones import VitConfig, build_vit
from models.director import ImageDirector, StochasticRollout
from models.feature_scores import FEATURE_SCORES, fit_feature_scorer, served_scores
from models.vit_view import VitTransitionView
from tests.models.test_kernel_error import lively_kernel
from training.posthoc.writing import script_module


def clusters(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Three Gaussian classes in 6 dimensions, [N, 6] features and [N] labels."""
    gen = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % 3
    centres = torch.tensor([[3.0, 0, 0, 0, 0, 0], [0, 3.0, 0, 0, 0, 0], [0, 0, 3.0, 0, 0, 0]])
    return centres[labels] + torch.randn(n, 6, generator=gen) * torch.tensor([1.0, 1.0, 1.0, 0.3, 0.3, 0.3]), labels


def test_each_score_is_its_definition() -> None:
    features, labels = clusters(600, seed=0)
    weight, bias = torch.randn(3, 6, generator=torch.Generator().manual_seed(1)), torch.tensor([0.1, -0.2, 0.3])
    scorer = fit_feature_scorer(features, labels, 3, weight, bias, seed=0, bank_size=200, knn_k=5)
    probe, _ = clusters(20, seed=2)
    probe = probe * 1.5  # [20, 6] some far from the classes
    got = scorer(probe).double()  # [20, 4]
    f, x = features.double(), probe.double()
    means = torch.stack([f[labels == c].mean(0) for c in range(3)])  # [3, 6]
    centred = f - means[labels]
    precision = torch.linalg.inv(centred.T @ centred / len(f))
    diff = x[:, None] - means[None]  # [20, 3, 6]
    distance = torch.einsum("bcd,de,bce->bc", diff, precision, diff)  # [20, 3]
    background = f - f.mean(0)
    back = x - f.mean(0)
    relative = distance - torch.einsum("bd,de,be->b", back, torch.linalg.inv(background.T @ background / len(f)),
                                       back)[:, None]
    torch.testing.assert_close(got[:, 0], distance.min(1).values, rtol=1e-4, atol=1e-4)
    # a difference of two distances of ~10: float32 keeps ~1e-6 of each, so compare at that scale
    torch.testing.assert_close(got[:, 1], relative.min(1).values, rtol=1e-4, atol=1e-3)
    bank = scorer.bank.double()  # [200, 6] unit rows drawn from the training features
    assert bank.shape == (200, 6) and torch.allclose(bank.norm(dim=1), torch.ones(200, dtype=torch.float64))
    similarity = (x / x.norm(dim=1, keepdim=True)) @ bank.T  # [20, 200]
    torch.testing.assert_close(got[:, 2], 1 - similarity.topk(5, dim=1).values[:, -1], rtol=1e-4, atol=1e-5)
    logits = x @ weight.double().T + bias.double()
    residual = ((x - scorer.vim_origin.double()) @ scorer.vim_residual.double()).norm(dim=1)
    assert scorer.vim_residual.shape == (6, 3)  # half the dimensions are the principal subspace
    torch.testing.assert_close(got[:, 3], float(scorer.vim_alpha) * residual - torch.logsumexp(logits, 1),
                               rtol=1e-4, atol=1e-4)
    unit, probe_unit = f / f.norm(dim=1, keepdim=True), x / x.norm(dim=1, keepdim=True)  # Mahalanobis++'s inputs
    unit_means = torch.stack([unit[labels == c].mean(0) for c in range(3)])  # [3, 6]
    unit_centred = unit - unit_means[labels]
    unit_diff = probe_unit[:, None] - unit_means[None]  # [20, 3, 6]
    unit_distance = torch.einsum("bcd,de,bce->bc", unit_diff, torch.linalg.inv(unit_centred.T @ unit_centred / len(f)),
                                 unit_diff)  # [20, 3]
    torch.testing.assert_close(got[:, 4], unit_distance.min(1).values, rtol=1e-3, atol=1e-3)
    scripted = script_module(scorer)
    torch.testing.assert_close(scripted(probe), scorer(probe))
    assert len(FEATURE_SCORES) == got.shape[1]


def test_far_inputs_score_higher() -> None:
    features, labels = clusters(600, seed=0)
    scorer = fit_feature_scorer(features, labels, 3, torch.eye(3, 6) * 2, torch.zeros(3), seed=0)
    near, _ = clusters(100, seed=3)
    far = torch.randn(100, 6, generator=torch.Generator().manual_seed(4)) * 0.3 + torch.tensor([0, 0, 0, 3.0, 3, 3])
    assert bool((scorer(far).mean(0) > scorer(near).mean(0)).all())


def director_with_teacher() -> tuple[ImageDirector, VitTransitionView, torch.nn.Module]:
    """A tiny frozen DIRECTOR (a 3-layer hybrid ViT, the last transition diffused) carrying the backbone's own last
    transition, so that its ``scored_rows`` returns the kernel error (and the feature scores once it has a scorer);
    its view and backbone beside it."""
    torch.manual_seed(0)
    backbone = build_vit(VitConfig(stem_channels=[8, 16], embed_dim=16, depth=3, num_heads=2)).eval()
    view = VitTransitionView(backbone)
    director = ImageDirector(view.embedding, StochasticRollout(lively_kernel(16, 2, 1)), view.readout_head,
                             view.prefix(2)).eval().requires_grad_(False)
    director.rollout.set_teacher(copy.deepcopy(view.teacher_steps(1)))
    return director, view, backbone


def test_a_director_returns_the_backbone_features_scores_beside_the_kernel_error() -> None:
    director, view, backbone = director_with_teacher()
    pixels = torch.rand(40, 1, 28, 28)
    with torch.no_grad():
        x = view.embed(pixels)
        for t in range(1, view.num_steps + 1):
            x, _ = view.transition(t, x)
        features = view.readout_head.features(x)  # [40, 16] the backbone's own
        torch.testing.assert_close(view.readout_head.head(features), backbone(pixels), atol=1e-5, rtol=0)
    weight, bias = view.readout_head.final_layer()
    director.feature_scorer = fit_feature_scorer(features, torch.arange(40) % 10, 10, weight, bias, seed=0)
    scripted = script_module(director)
    rows, scores = scripted.scored_rows(pixels[:5], torch.tensor([2, 1, 1, 1, 3]))
    assert rows.shape == (8, 10) and scores.shape == (5, 1 + len(FEATURE_SCORES))
    # the scripted path rounds differently; RMDS (a difference of distances) magnifies it
    torch.testing.assert_close(scores[:, 1:], director.feature_scorer(features[:5]), rtol=1e-3, atol=1e-3)


def test_a_scorer_keeps_only_the_scores_it_is_asked_for() -> None:
    """``keep``: the kept columns, in ``FEATURE_SCORES`` order, equal the full scorer's, scripted too; the statistics
    only dropped scores read are dropped with them (the KNN bank), and an unknown name is refused."""
    features, labels = clusters(600, seed=0)
    full = fit_feature_scorer(features, labels, 3, torch.eye(3, 6) * 2, torch.zeros(3), seed=0, bank_size=200, knn_k=5)
    probe, _ = clusters(20, seed=2)
    everything = full(probe)  # [20, 4]
    for kept in (["mds"], ["vim", "rmds"], ["knn"], ["mds_pp"], []):
        scorer = copy.deepcopy(full)
        scorer.keep(kept)
        order = [name for name in FEATURE_SCORES if name in kept]
        assert served_scores(scorer) == tuple(order) == served_scores(script_module(scorer))
        columns = [FEATURE_SCORES.index(name) for name in order]
        torch.testing.assert_close(scorer(probe), everything[:, columns], rtol=0, atol=0)
        torch.testing.assert_close(script_module(scorer)(probe), everything[:, columns], rtol=1e-5, atol=1e-6)
        assert scorer.bank.shape[0] == (200 if "knn" in kept else 0)
    with pytest.raises(ValueError, match="unknown feature scores"):
        copy.deepcopy(full).keep(["mds", "energy"])
    only_mds = copy.deepcopy(full)
    only_mds.keep(["mds"])
    with pytest.raises(ValueError, match="were dropped"):
        only_mds.keep(["mds", "knn"])


def test_a_director_keeping_one_score_returns_that_column() -> None:
    """A DIRECTOR whose scorer keeps only ``mds`` returns the kernel error and ``mds`` from ``scored_rows``, equal to
    the columns of the same DIRECTOR computing every score, and it no longer holds the KNN bank."""
    director, view, _ = director_with_teacher()
    weight, bias = view.readout_head.final_layer()
    features = torch.randn(400, 16)
    director.feature_scorer = fit_feature_scorer(features, torch.arange(400) % 10, 10, weight, bias, seed=0)
    pixels, repeats = torch.rand(5, 1, 28, 28), torch.tensor([2, 1, 1, 1, 3])
    with torch.no_grad():
        torch.manual_seed(1)
        rows, scores = director.scored_rows(pixels, repeats)  # [8, 10], [5, 5]
        director.feature_scorer.keep(["mds"])
        torch.manual_seed(1)
        kept_rows, kept_scores = script_module(director).scored_rows(pixels, repeats)  # [8, 10], [5, 2]
    torch.testing.assert_close(kept_rows, rows, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(kept_scores, scores[:, :2], rtol=1e-5, atol=1e-6)
    assert director.feature_scorer.bank.numel() == 0
