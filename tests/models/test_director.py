import io
import math

import pytest
import torch

from models.backbones import VitConfig, build_vit
from models.director import ImageDirector, StochasticRollout
from models.kernel import TransitionKernel
from models.vit_view import VitTransitionView


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
    scripted = torch.jit.script(director)
    buffer = io.BytesIO()
    torch.jit.save(scripted, buffer)
    buffer.seek(0)
    loaded = torch.jit.load(buffer)
    pixels = torch.rand(2, 1, 28, 28)
    torch.manual_seed(0)
    eager = director(pixels, 3)
    torch.manual_seed(0)
    torch.testing.assert_close(loaded(pixels, 3), eager, atol=1e-5, rtol=0)
    torch.manual_seed(0)
    torch.testing.assert_close(loaded.sample_rows(pixels, torch.tensor([3, 3])), eager.transpose(0, 1).reshape(6, 10),
                               atol=1e-5, rtol=0)
