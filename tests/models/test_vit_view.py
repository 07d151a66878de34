import pytest
import torch

from models.backbones import VitConfig, build_vit
from models.vit_view import VitTransitionView


@pytest.mark.parametrize(
    "cfg",
    [
        VitConfig(stem_channels=[8, 16, 16], embed_dim=32, depth=3, num_heads=2),  # hybrid stem, mean pooling
        VitConfig(patch_size=4, embed_dim=48, depth=2, num_heads=3, class_token=True, global_pool="token"),
        VitConfig(img_size=16, in_chans=3, patch_size=4, embed_dim=24, depth=5, num_heads=4, mean=[0.5] * 3,
                  std=[0.25] * 3),
    ],
)
def test_chained_transitions_reproduce_backbone_logits(cfg: VitConfig) -> None:
    torch.manual_seed(0)
    model = build_vit(cfg).eval()
    view = VitTransitionView(model)
    pixels = torch.rand(4, cfg.in_chans, cfg.img_size, cfg.img_size)
    with torch.no_grad():
        expected = model(pixels)
        x = view.embed(pixels)
        for t in range(1, view.num_steps + 1):
            x, variance = view.transition(t, x)
            assert variance.shape == x.shape and bool((variance >= 0).all())
        logits = view.readout(x)
    assert view.num_steps == cfg.depth
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=0)


def test_transition_ends_with_attention() -> None:
    """X_t equals a_t: the state right after layer t's attention sublayer."""
    torch.manual_seed(1)
    model = build_vit(VitConfig(patch_size=7, embed_dim=16, depth=3, num_heads=2)).eval()
    view = VitTransitionView(model)
    pixels = torch.rand(2, 1, 28, 28)
    captured = []
    hooks = [blk.attn.register_forward_hook(lambda m, i, o: captured.append(o)) for blk in model.vit.blocks]
    with torch.no_grad():
        h = view.embed(pixels)
        a1 = h + model.vit.blocks[0].attn(model.vit.blocks[0].norm1(h))
        x1, _ = view.transition(1, h)
    for hook in hooks:
        hook.remove()
    torch.testing.assert_close(x1, a1)


def test_transition_rejects_bad_step() -> None:
    view = VitTransitionView(build_vit(VitConfig(patch_size=7, embed_dim=16, depth=2, num_heads=2)))
    with pytest.raises(ValueError):
        view.transition(0, torch.zeros(1, 16, 16))
    with pytest.raises(ValueError):
        view.transition(3, torch.zeros(1, 16, 16))


@pytest.mark.parametrize("num_transitions", [0, 1, 2, 3])
def test_prefix_equals_the_first_transitions(num_transitions: int) -> None:
    """Partial depth: the deterministic prefix reproduces X_P of the chained transitions, scripted too."""
    torch.manual_seed(2)
    model = build_vit(VitConfig(stem_channels=[8, 16], embed_dim=16, depth=3, num_heads=2)).eval()
    view = VitTransitionView(model)
    pixels = torch.rand(3, 1, 28, 28)
    prefix = view.prefix(num_transitions)
    with torch.no_grad():
        x = view.embed(pixels)
        expected = x
        for t in range(1, num_transitions + 1):
            expected, _ = view.transition(t, expected)
        torch.testing.assert_close(prefix(x), expected, atol=1e-5, rtol=0)
        torch.testing.assert_close(torch.jit.script(prefix)(x, None), expected, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="transitions"):
        view.prefix(4)
