"""Backbone classifiers the pipeline trains or loads. Vision: a timm ``VisionTransformer``, optionally
with a small convolutional stem (timm ``HybridEmbed``) that speeds convergence on small images."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial

import torch
from timm.layers import BatchNormAct2d, ConvNormAct, HybridEmbed
from timm.models.vision_transformer import VisionTransformer
from torch import nn
from torch.nn.utils.fusion import fuse_conv_bn_eval


@dataclass
class VitConfig:
    """A timm ViT; ``stem_channels`` empty means plain patch embedding with ``patch_size``."""

    __pydantic_config__ = {"extra": "forbid"}  # read from a training config: an unknown key is refused

    img_size: int = 28
    in_chans: int = 1
    num_classes: int = 10
    patch_size: int = 4
    stem_channels: list[int] = field(default_factory=list)
    embed_dim: int = 96
    depth: int = 4
    num_heads: int = 4
    mlp_ratio: float = 2.0
    class_token: bool = False
    global_pool: str = "avg"
    drop_rate: float = 0.0
    proj_drop_rate: float = 0.0
    attn_drop_rate: float = 0.0
    drop_path_rate: float = 0.0
    mean: list[float] = field(default_factory=lambda: [0.5])
    std: list[float] = field(default_factory=lambda: [0.5])


def conv_stem(in_chans: int, channels: Sequence[int]) -> nn.Sequential:
    """3x3 conv-BN-GELU layers; the first keeps the resolution, every later one halves it."""
    layers: list[nn.Module] = []
    prev = in_chans
    for i, ch in enumerate(channels):
        layers.append(ConvNormAct(prev, ch, kernel_size=3, stride=1 if i == 0 else 2, act_layer=nn.GELU))
        prev = ch
    return nn.Sequential(*layers)


def fold_batch_norms(model: nn.Module) -> int:
    """Fold every conv stem layer's batch norm (timm ``ConvNormAct`` with ``BatchNormAct2d``, in eval mode) into its
    convolution, for an inference artifact: the same function (to float32 rounding) without the normalisation pass,
    which took about a quarter of the stem's time on CPU. Returns how many were folded; ``model`` must not be
    trained after."""
    folded = 0
    for block in model.modules():
        if isinstance(block, ConvNormAct) and isinstance(block.bn, BatchNormAct2d) and not block.bn.training:
            if block.bn.running_mean is None or not isinstance(block.conv, nn.Conv2d):
                continue
            block.conv = fuse_conv_bn_eval(block.conv, block.bn)  # the conv with the norm's scale and shift
            block.bn = nn.Sequential(block.bn.drop, block.bn.act)  # what BatchNormAct2d does after normalising
            folded += 1
    return folded


def unfold_batch_norms(state: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """The weights ``state`` of a model whose stem ``fold_batch_norms`` folded, in the layout of ``model`` (the same
    architecture, unfolded): each folded convolution's bias becomes the shift of a batch norm that is otherwise the
    identity (scale 1, running mean 0, running variance 1 - eps), so the model computes the same function. Keys already
    in ``model``'s layout pass unchanged."""
    state = dict(state)
    for name, block in model.named_modules():
        bias_key, norm = f"{name}.conv.bias", f"{name}.bn"
        if not (isinstance(block, ConvNormAct) and isinstance(block.bn, BatchNormAct2d) and bias_key in state
                and f"{norm}.weight" not in state):
            continue
        bias = state.pop(bias_key)  # [C_out]
        state[f"{norm}.weight"] = torch.ones_like(bias)
        state[f"{norm}.bias"] = bias
        state[f"{norm}.running_mean"] = torch.zeros_like(bias)
        state[f"{norm}.running_var"] = torch.full_like(bias, 1.0 - block.bn.eps)  # sqrt(var + eps) = 1
        state[f"{norm}.num_batches_tracked"] = torch.zeros((), dtype=torch.long)
    return state


class ImageClassifier(nn.Module):
    """Pixels in [0, 1] -> logits; the normalisation lives inside so artifacts are self-contained."""

    def __init__(self, vit: VisionTransformer, mean: Sequence[float], std: Sequence[float]) -> None:
        super().__init__()
        self.vit = vit
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1))
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1))

    def normalize(self, pixels: torch.Tensor) -> torch.Tensor:
        return (pixels - self.mean) / self.std

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.vit(self.normalize(pixels))  # [B, C]


def build_vit(cfg: VitConfig) -> ImageClassifier:
    kwargs: dict = {}
    patch_size = cfg.patch_size
    if cfg.stem_channels:
        stem = conv_stem(cfg.in_chans, cfg.stem_channels)
        kwargs["embed_layer"] = partial(HybridEmbed, backbone=stem)
        patch_size = 1
    vit = VisionTransformer(
        img_size=cfg.img_size,
        patch_size=patch_size,
        in_chans=cfg.in_chans,
        num_classes=cfg.num_classes,
        embed_dim=cfg.embed_dim,
        depth=cfg.depth,
        num_heads=cfg.num_heads,
        mlp_ratio=cfg.mlp_ratio,
        qkv_bias=True,
        class_token=cfg.class_token,
        global_pool=cfg.global_pool,
        drop_rate=cfg.drop_rate,
        proj_drop_rate=cfg.proj_drop_rate,
        attn_drop_rate=cfg.attn_drop_rate,
        drop_path_rate=cfg.drop_path_rate,
        **kwargs,
    )
    return ImageClassifier(vit, cfg.mean, cfg.std)
