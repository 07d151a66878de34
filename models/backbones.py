"""Backbone classifiers the pipeline trains or loads. Vision: a timm ``VisionTransformer``, optionally
with a small convolutional stem (timm ``HybridEmbed``) that speeds convergence on small images."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial

import torch
from timm.layers import ConvNormAct, HybridEmbed
from timm.models.vision_transformer import VisionTransformer
from torch import nn


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
