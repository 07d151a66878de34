"""The variance-versus-error diagnostic measures what it says: the kernel's error against the backbone's own next
state, and the variance it predicts without the served noise temperature."""

from __future__ import annotations

import math

import torch

from models.backbones import VitConfig, build_vit
from models.director import ImageDirector, StochasticRollout
from models.kernel import TransitionKernel
from models.vit_view import VitTransitionView
from training.data.images import Split
from training.posthoc.rollout_diagnostics import KernelErrors, error_and_variance, variance_report


def partial_depth_director(noise_scale: float) -> tuple[ImageDirector, VitTransitionView]:
    """K = 1 of a 3-layer ViT with a fresh kernel: its mean head starts at zero, so its mean is its input."""
    torch.manual_seed(0)
    view = VitTransitionView(build_vit(VitConfig(stem_channels=[8, 16], embed_dim=16, depth=3, num_heads=2)).eval())
    kernel = TransitionKernel(16, 2, 1, logvar_init=math.log(0.05))
    rollout = StochasticRollout(kernel, noise_scale=noise_scale)
    return ImageDirector(view.embedding, rollout, view.readout_head, view.prefix(2)).eval(), view


def test_a_fresh_kernel_errs_by_the_backbones_own_step_and_predicts_its_initial_variance() -> None:
    director, view = partial_depth_director(noise_scale=0.5)
    pixels = torch.rand(3, 1, 28, 28)
    out = error_and_variance(director, view, (pixels,))  # [3, 2]
    with torch.no_grad():
        x = view.prefix(2)(view.embedding(pixels))  # [3, N, D] X_{T-1}
        target, _ = view.transition(3, x)  # [3, N, D] the backbone's X_T
    torch.testing.assert_close(out[:, 0], (x - target).square().mean(dim=(1, 2)))
    torch.testing.assert_close(out[:, 1], torch.full((3,), 0.05))  # the noise temperature is left out


def test_variance_report_sets_every_ood_set_against_the_test_split() -> None:
    director, view = partial_depth_director(noise_scale=1.0)
    test = Split(torch.rand(12, 1, 28, 28) * 0.2, torch.zeros(12, dtype=torch.long))
    noise = Split(torch.rand(12, 1, 28, 28), torch.zeros(12, dtype=torch.long))
    errors = KernelErrors(director, view)
    report = variance_report(errors, test, {"noise": noise})
    assert errors("noise", noise) is errors.values["noise"]  # computed once, read again
    assert set(report) == {"test", "noise"} and "auroc_error" not in report["test"]
    assert 0.0 <= report["noise"]["auroc_error"] <= 1.0 and 0.0 <= report["noise"]["auroc_variance"] <= 1.0
    # the fresh kernel predicts one variance everywhere: no rank correlation, and no better than chance as a score
    assert report["noise"]["spearman"] is None and report["noise"]["auroc_variance"] == 0.5
