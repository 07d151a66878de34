"""The folded kernel an artifact carries gives the training kernel's mean and log-variance at every step, from
per-step weights alone."""

from __future__ import annotations

import math

import pytest
import torch

from models.folded_kernel import FoldedKernel
from models.kernel import TransitionKernel
from training.posthoc.writing import script_module


def trained_like(causal: bool = False) -> TransitionKernel:
    """A kernel whose adaLN, gates and heads are all non-zero, so every folded term matters."""
    torch.manual_seed(0)
    kernel = TransitionKernel(dim=16, num_heads=4, depth=3, mlp_ratio=2.0, logvar_init=math.log(0.01),
                              logvar_min=torch.log(torch.tensor([1e-4, 2e-4, 3e-4])),
                              logvar_max=torch.log(torch.tensor([0.5, 1.0, 2.0])), causal=causal)
    with torch.no_grad():
        for module in (kernel.adaLN_modulation[-1], kernel.mean_head, kernel.var_head):
            module.weight.normal_(std=0.3)
            module.bias.normal_(std=0.3)
    return kernel.eval()


@pytest.mark.parametrize("causal", [False, True])
def test_every_step_matches_the_unfolded_kernel_with_padding(causal: bool) -> None:
    kernel = trained_like(causal)
    folded = FoldedKernel(kernel)
    x = torch.randn(3, 7, 16)  # [R, N, D]
    mask = torch.ones(3, 7, dtype=torch.bool)
    mask[1, 5:] = False  # a padded row
    with torch.no_grad():
        for t in (1, 2, 3):
            mean, logvar = kernel.step_moments(x, t, mask)
            folded_mean, folded_logvar = folded.step_moments(x, t, mask)
            torch.testing.assert_close(folded_mean, mean, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(folded_logvar, logvar, atol=1e-5, rtol=1e-5)
        assert not torch.allclose(kernel.step_moments(x, 1, None)[0], kernel.step_moments(x, 3, None)[0])


def test_the_folded_kernel_scripts_and_carries_no_conditioning_weights() -> None:
    kernel = trained_like()
    folded = FoldedKernel(kernel)
    served = script_module(folded)
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        expected = kernel.step_moments(x, 2, None)
    got = served.step_moments(x, 2, None)
    torch.testing.assert_close(got[0], expected[0], atol=1e-5, rtol=1e-5)
    keys = set(folded.state_dict())
    assert not any("adaLN" in k or "t_embedder" in k or "mean_head" in k for k in keys)
    assert folded.head_weight.shape == (3, 32, 16)  # [K, 2D, D]: both heads, one layer per step
    assert not any(p.requires_grad for p in folded.parameters())
