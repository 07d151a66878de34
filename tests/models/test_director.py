import math

import pytest
import torch

from models.backbones import VitConfig, build_vit
from models.director import ImageDirector, StochasticRollout
from models.kernel import TransitionKernel
from models.vit_view import VitTransitionView
from tests.models.scripting import scripted


@pytest.fixture
def director() -> ImageDirector:
    torch.manual_seed(0)
    view = VitTransitionView(build_vit(VitConfig(stem_channels=[8, 16], embed_dim=16, depth=3, num_heads=2)).eval())
    kernel = TransitionKernel(16, 2, view.num_steps, logvar_init=math.log(0.05))
    with torch.no_grad():
        kernel.adaLN_modulation[-1].weight.normal_(std=0.05)
    return ImageDirector(view.embedding, StochasticRollout(kernel), view.readout_head).eval()


def test_forward_shape_and_independent_samples(director: ImageDirector) -> None:
    pixels = torch.rand(3, 1, 28, 28)
    logits = director(pixels, 5)
    assert logits.shape == (5, 3, 10)
    assert not torch.allclose(logits[0], logits[1])  # samples differ
    assert not torch.allclose(director(pixels, 5), logits)  # two calls differ


def test_reproducible_under_manual_seed(director: ImageDirector) -> None:
    pixels = torch.rand(2, 1, 28, 28)
    torch.manual_seed(3)
    first = director(pixels, 4)
    torch.manual_seed(3)
    torch.testing.assert_close(director(pixels, 4), first)


def test_sample_rows_groups_rows_by_input(director: ImageDirector) -> None:
    pixels = torch.rand(3, 1, 28, 28)
    repeats = torch.tensor([1, 3, 2])
    director.rollout.noise_scale.fill_(0.0)  # noise off: every row equals its input's deterministic path
    rows = director.sample_rows(pixels, repeats)
    single = [director.sample_rows(pixels[i : i + 1], torch.tensor([1])) for i in range(3)]
    assert rows.shape == (6, 10)
    expected = torch.cat([single[0], single[1].expand(3, -1), single[2].expand(2, -1)])
    torch.testing.assert_close(rows, expected, atol=1e-5, rtol=0)


def test_first_transition_runs_once_per_input(director: ImageDirector) -> None:
    calls: list[int] = []
    original = director.rollout.step

    def counting_step(x, t, mask):
        calls.append(x.shape[0]) if t == 1 else None
        return original(x, t, mask)

    director.rollout.step = counting_step  # type: ignore[method-assign]
    director.sample_rows(torch.rand(2, 1, 28, 28), torch.tensor([4, 7]))
    assert calls == [2]  # step 1 on the 2 inputs, not on their 11 sample rows


def test_scripted_matches_eager_and_survives_save_load(director: ImageDirector) -> None:
    director.rollout.fold_conditioning()
    loaded = scripted(director)
    pixels = torch.rand(2, 1, 28, 28)
    torch.manual_seed(0)
    eager = director(pixels, 3)
    torch.manual_seed(0)
    torch.testing.assert_close(loaded(pixels, 3), eager, atol=1e-5, rtol=0)
    torch.manual_seed(0)
    torch.testing.assert_close(loaded.sample_rows(pixels, torch.tensor([3, 3])), eager.transpose(0, 1).reshape(6, 10),
                               atol=1e-5, rtol=0)


def rollout_noise(rho: float, rows: int = 4000) -> torch.Tensor:
    """``rows`` draws of the rollout's standard-normal noise [rows, 5, 3] at token correlation ``rho``."""
    kernel = TransitionKernel(4, 1, 1)
    rollout = StochasticRollout(kernel, token_correlation=rho)
    torch.manual_seed(0)
    return rollout.noise(torch.zeros(rows, 5, 3))


@pytest.mark.parametrize("rho", [0.0, 0.5, 1.0])
def test_token_correlation_keeps_each_element_standard_normal(rho: float) -> None:
    noise = rollout_noise(rho)
    assert abs(float(noise.mean())) < 0.05
    torch.testing.assert_close(noise.var(dim=0), torch.ones(5, 3), atol=0.1, rtol=0)  # per element


@pytest.mark.parametrize("rho", [0.0, 0.5, 1.0])
def test_token_correlation_is_the_correlation_across_tokens(rho: float) -> None:
    noise = rollout_noise(rho)
    across_tokens = torch.corrcoef(torch.stack([noise[:, 0, 1], noise[:, 3, 1]]))[0, 1]  # two tokens, one feature
    across_features = torch.corrcoef(torch.stack([noise[:, 0, 0], noise[:, 0, 2]]))[0, 1]  # one token
    assert abs(float(across_tokens) - rho) < 0.06
    assert abs(float(across_features)) < 0.06


def test_token_correlation_is_refused_outside_the_unit_interval() -> None:
    with pytest.raises(ValueError, match="token_correlation"):
        StochasticRollout(TransitionKernel(4, 1, 1), token_correlation=1.5)


def test_shared_noise_moves_the_pooled_readout_more(director: ImageDirector) -> None:
    """Noise drawn per token is averaged away by the readout's pooling; the same marginal noise shared across tokens
    spreads the sampled logits further."""
    pixels = torch.rand(4, 1, 28, 28)
    with torch.no_grad():
        torch.manual_seed(1)
        independent = director(pixels, 64).std(dim=0).mean()
        director.rollout.set_token_correlation(1.0)
        torch.manual_seed(1)
        shared = director(pixels, 64).std(dim=0).mean()
    assert float(shared) > 1.5 * float(independent)


def test_token_correlation_survives_scripting(director: ImageDirector) -> None:
    director.rollout.set_token_correlation(0.7)
    director.rollout.fold_conditioning()
    loaded = scripted(director)
    pixels = torch.rand(2, 1, 28, 28)
    torch.manual_seed(0)
    eager = director(pixels, 3)
    torch.manual_seed(0)
    torch.testing.assert_close(loaded(pixels, 3), eager, atol=1e-5, rtol=0)
    assert float(loaded.rollout.token_correlation) == pytest.approx(0.7)
