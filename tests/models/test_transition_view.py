"""The views' shared part: one step range, one composition of the two sublayers, the teacher's last K steps equal
to the transitions they package (the decoder's own file checks its view the same way)."""

from __future__ import annotations

import pytest
import torch

from models.backbones import VitConfig, build_vit
from models.bert_view import BertTransitionView
from models.text_backbones import TextClassifier, build_tiny_bert
from models.transition_view import TransitionViewBase
from models.vit_view import VitTransitionView

pytestmark = pytest.mark.usefixtures("one_thread")


def _views() -> list[tuple[TransitionViewBase, tuple[torch.Tensor, ...], torch.Tensor | None]]:
    """A tiny ViT and a tiny BERT view, each with X_0-making inputs and its key-padding mask."""
    torch.manual_seed(0)
    vit = VitTransitionView(build_vit(VitConfig(patch_size=7, embed_dim=16, depth=3, num_heads=2)).eval())
    bert = BertTransitionView(TextClassifier(build_tiny_bert(), num_classes=3, pooling="mean").eval())
    ids = torch.randint(1, 50, (2, 5))  # [B, L]
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])  # [B, L]
    return [(vit, (torch.rand(2, 1, 28, 28),), None), (bert, (ids * mask, mask), mask.bool())]


@pytest.mark.parametrize("which", [0, 1], ids=["vit", "bert"])
def test_the_step_range_is_one_rule(which: int) -> None:
    view = _views()[which][0]
    assert isinstance(view, TransitionViewBase)
    for bad in (0, view.num_steps + 1):
        with pytest.raises(ValueError, match=f"t must be in 1..{view.num_steps}"):
            view.transition(bad, torch.zeros(1, 3, view.dim))
        with pytest.raises(ValueError, match=f"depth must be in 1..{view.num_steps}"):
            view.teacher_steps(bad)
    assert list(view.last_steps(2)) == [view.num_steps - 1, view.num_steps]


@pytest.mark.parametrize("which", [0, 1], ids=["vit", "bert"])
def test_teacher_steps_package_the_transitions(which: int) -> None:
    """Each of the last K steps, as a deterministic module, maps X_{t-1} to the transition's mean X_t."""
    view, inputs, mask = _views()[which]
    with torch.no_grad():
        states = [view.embed(*inputs)]  # X_0 [B, N, D]
        for t in range(1, view.num_steps + 1):
            states.append(view.transition(t, states[-1], mask)[0])
        steps = view.teacher_steps(view.num_steps)
        assert len(steps) == view.num_steps
        for t, step in zip(range(1, view.num_steps + 1), steps, strict=True):
            out = step(states[t - 1], mask)  # [B, N, D]
            keep = slice(None) if mask is None else mask
            torch.testing.assert_close(out[keep], states[t][keep], atol=1e-5, rtol=0)
