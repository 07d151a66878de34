import math

import pytest
import torch

from models.kernel import KernelConfig, TransitionKernel, soft_clamp


def _kernel(**kwargs) -> TransitionKernel:
    torch.manual_seed(0)
    args = {"dim": 16, "num_heads": 2, "depth": 3, "mlp_ratio": 1.0, "logvar_init": math.log(0.01),
            "logvar_min": torch.log(torch.tensor([1e-5, 2e-5, 3e-5])), "logvar_max": torch.log(torch.tensor([1.0] * 3))}
    args.update(kwargs)
    return TransitionKernel(**args)


def test_fresh_kernel_is_identity_with_observed_variance() -> None:
    kernel = _kernel()
    x = torch.randn(4, 7, 16)
    steps = torch.tensor([1, 2, 3, 1])
    mean, logvar = kernel(x, steps)
    torch.testing.assert_close(mean, x)
    # the smooth clamp moves a value well inside the bounds by less than 1e-3 in log space
    torch.testing.assert_close(logvar, torch.full_like(logvar, math.log(0.01)), atol=1e-3, rtol=0)


def test_soft_clamp_bounds_and_keeps_gradients() -> None:
    low, high = torch.tensor(-2.0), torch.tensor(3.0)
    x = torch.tensor([-4.0, -2.0, 0.5, 3.0, 5.0], requires_grad=True)
    y = soft_clamp(x, low, high)
    assert bool((y > low).all())
    assert bool((y <= high + math.log1p(math.exp(-4.0 * 5.0)) / 4.0).all())
    y.sum().backward()
    assert bool((x.grad > 0).all())  # never exactly zero at or past either edge
    assert abs(float(y[2].detach()) - 0.5) < 1e-3  # identity well inside the bounds


def test_precomputed_conditioning_matches_per_row_conditioning() -> None:
    kernel = _kernel()
    with torch.no_grad():  # non-zero adaLN so the conditioning matters
        kernel.adaLN_modulation[-1].weight.normal_(std=0.1)
        kernel.mean_head.weight.normal_(std=0.1)
    x = torch.randn(3, 5, 16)
    steps = torch.full((3,), 2)
    direct = kernel(x, steps)
    table = kernel.conditioning(torch.arange(1, 4))  # [T, 8D]
    folded = kernel.forward_conditioned(x, table[1:2], torch.tensor([1]))
    torch.testing.assert_close(direct[0], folded[0])
    torch.testing.assert_close(direct[1], folded[1])
    other = kernel(x, torch.full((3,), 3))
    assert not torch.allclose(direct[0], other[0])  # the step changes the map


def test_key_padding_mask_isolates_padding() -> None:
    kernel = _kernel()
    with torch.no_grad():
        kernel.adaLN_modulation[-1].weight.normal_(std=0.5)
        kernel.adaLN_modulation[-1].bias.normal_(std=0.5)
        kernel.mean_head.weight.normal_(std=0.1)
    x = torch.randn(1, 6, 16)
    mask = torch.tensor([[True] * 4 + [False] * 2])
    padded_mean, _ = kernel(x, torch.tensor([1]), mask)
    x_other_padding = x.clone()
    x_other_padding[:, 4:] = torch.randn(1, 2, 16) * 10
    other_mean, _ = kernel(x_other_padding, torch.tensor([1]), mask)
    torch.testing.assert_close(padded_mean[:, :4], other_mean[:, :4], atol=1e-5, rtol=0)


def test_kernel_config_builds_the_same_kernel_and_round_trips() -> None:
    bounds = torch.log(torch.tensor([1e-5, 2e-5, 3e-5])), torch.log(torch.tensor([1.0] * 3))
    config = KernelConfig(dim=16, num_heads=2, depth=3, logvar_init=math.log(0.01), logvar_min=bounds[0],
                          logvar_max=bounds[1])
    torch.manual_seed(0)
    built = TransitionKernel.from_config(config)
    for key, value in _kernel().state_dict().items():
        torch.testing.assert_close(built.state_dict()[key], value, rtol=0, atol=0)
    again = KernelConfig.from_document(config.document())
    assert again.document().keys() == config.document().keys() and again.depth == 3 and not again.causal
    torch.testing.assert_close(again.logvar_min, bounds[0])


def test_kernel_config_reads_the_older_constructor_arguments() -> None:
    legacy = {"dim": 16, "num_heads": 2, "num_steps": 2, "mlp_ratio": 1.0, "frequency_embedding_size": 64,
              "logvar_init": 0.0, "logvar_min": torch.zeros(2), "logvar_max": torch.ones(2)}
    config = KernelConfig.from_document(legacy)
    assert (config.depth, config.causal) == (2, False)
    assert TransitionKernel.from_config(config).num_steps == 2


def test_kernel_config_refuses_bounds_of_another_depth() -> None:
    with pytest.raises(ValueError, match="3 entries for 2 steps"):
        KernelConfig(dim=16, num_heads=2, depth=2, logvar_min=torch.zeros(3))
