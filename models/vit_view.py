"""A timm ``VisionTransformer`` re-read as T transitions that each end with attention (docs/method.md).

``X_0`` is the patch + position embedding; transition 1 is layer 1's attention sublayer; transition
t > 1 runs layer t-1's MLP sublayer then layer t's attention sublayer, so ``X_t = a_t``; the readout
is the last MLP sublayer, the final norm, pooling and the head.
"""

from __future__ import annotations

import torch
from timm.models.deit import VisionTransformerDistilled
from timm.models.vision_transformer import Block, VisionTransformer
from torch import nn

from models.backbones import ImageClassifier
from models.observed_variance import attention_with_mixture_variance
from models.transition_view import TransitionViewBase


class VitEmbedding(nn.Module):
    """Pixels in [0, 1] [B, C, H, W] -> X_0 [B, N, D] (normalisation, patch embedding, prefix tokens, position).

    The prefix tokens are timm's, in its order: the class token, then register tokens or a DeiT distillation token.
    ``embed_prefix``: the position embedding covers them (concatenate, then add) or only the patches (add, then
    concatenate; timm's ``no_embed_class``)."""

    def __init__(self, backbone: ImageClassifier) -> None:
        super().__init__()
        vit = backbone.vit
        if vit.dynamic_img_size or vit.pos_embed is None:
            raise ValueError("the ViT view needs a fixed image size and learned position embeddings")
        self.register_buffer("mean", backbone.mean.clone())
        self.register_buffer("std", backbone.std.clone())
        self.patch_embed = vit.patch_embed
        tokens = [t for t in (vit.cls_token, vit.reg_token, getattr(vit, "dist_token", None)) if t is not None]
        prefix = torch.cat([t.detach() for t in tokens], dim=1) if tokens else torch.zeros(1, 0, vit.embed_dim)
        self.prefix_tokens = nn.Parameter(prefix.clone(), requires_grad=bool(tokens))  # [1, P, D]
        self.pos_embed = vit.pos_embed
        self.embed_prefix = not vit.no_embed_class
        self.norm_pre = vit.norm_pre

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed((pixels - self.mean) / self.std)  # [B, N_patches, D]
        prefix = self.prefix_tokens.expand(x.shape[0], -1, -1)  # [B, P, D]
        if self.embed_prefix:
            x = torch.cat([prefix, x], dim=1) + self.pos_embed  # [B, N, D]
        else:
            x = torch.cat([prefix, x + self.pos_embed], dim=1)  # [B, N, D]
        return self.norm_pre(x)


class VitReadout(nn.Module):
    """X_T [B, N, D] -> logits [B, C]: the last MLP sublayer, final norm, pooling, head. Pooling: the class token,
    the mean of the patches (prefix tokens excluded), or a distilled DeiT's two heads averaged (class token through
    ``head``, distillation token through ``head_dist``, as timm and Hugging Face do at inference)."""

    def __init__(self, vit: VisionTransformer) -> None:
        super().__init__()
        if vit.global_pool not in ("avg", "token") or vit.attn_pool is not None or vit.pool_include_prefix:
            raise ValueError(f"unsupported pooling {vit.global_pool!r}")
        last: Block = vit.blocks[-1]
        self.norm2, self.mlp, self.ls2 = last.norm2, last.mlp, last.ls2
        self.norm = vit.norm
        self.fc_norm = vit.fc_norm
        self.head = vit.head
        self.distilled = isinstance(vit, VisionTransformerDistilled)
        self.head_dist = vit.head_dist if isinstance(vit, VisionTransformerDistilled) else nn.Identity()
        self.pool_avg = vit.global_pool == "avg"
        self.num_prefix_tokens = vit.num_prefix_tokens

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.ls2(self.mlp(self.norm2(x)))  # [B, N, D]
        x = self.norm(x)
        if self.distilled:
            return (self.head(x[:, 0]) + self.head_dist(x[:, 1])) / 2  # [B, C]
        x = x[:, self.num_prefix_tokens :].mean(dim=1) if self.pool_avg else x[:, 0]  # [B, D]
        return self.head(self.fc_norm(x))  # [B, C]

    def features(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        """X_T [B, N, D] -> the head's input [B, D'] (a distilled DeiT: both tokens' features, [B, 2D])."""
        x = self.norm(x + self.ls2(self.mlp(self.norm2(x))))  # [B, N, D]
        if self.distilled:
            return torch.cat([x[:, 0], x[:, 1]], dim=1)  # [B, 2D]
        x = x[:, self.num_prefix_tokens :].mean(dim=1) if self.pool_avg else x[:, 0]  # [B, D]
        return self.fc_norm(x)  # [B, D]

    @torch.jit.unused
    def final_layer(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(weight [C, D'], bias [C]) with logits = features @ weight.T + bias."""
        if self.distilled:
            weight = torch.cat([self.head.weight, self.head_dist.weight], dim=1) / 2  # [C, 2D]
            return weight.detach(), ((self.head.bias + self.head_dist.bias) / 2).detach()
        return self.head.weight.detach(), self.head.bias.detach()


class VitPrefix(nn.Module):
    """The first ``num_transitions`` transitions run as the real backbone (partial depth, docs/method.md):
    X_0 [B, N, D] -> X_{T-K} = a_{T-K} [B, N, D], deterministic. Transitions end with attention, so this is
    layers 1..T-K-1 whole and then layer T-K's attention sublayer; zero transitions is the identity."""

    def __init__(self, blocks: nn.ModuleList, num_transitions: int) -> None:
        super().__init__()
        if not 0 <= num_transitions <= len(blocks):
            raise ValueError(f"a prefix has 0..{len(blocks)} transitions, got {num_transitions}")
        self.num_transitions = num_transitions
        self.full_blocks = nn.ModuleList(blocks[: max(num_transitions - 1, 0)])
        self.last = nn.ModuleList(blocks[num_transitions - 1 : num_transitions] if num_transitions else [])

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        for block in self.full_blocks:
            x = block(x)  # [B, N, D] attention + MLP sublayers
        for block in self.last:  # at most one: its attention sublayer only
            x = x + block.ls1(block.attn(block.norm1(x)))  # [B, N, D]
        return x


class VitTransition(nn.Module):
    """One transition t of the re-partitioned ViT as a deterministic module: X_{t-1} [B, N, D] -> X_t = a_t [B, N, D],
    layer t-1's MLP sublayer (none at t = 1) then layer t's attention sublayer. Shares the backbone's weights."""

    def __init__(self, previous: Block | None, block: Block) -> None:
        super().__init__()
        self.previous = nn.ModuleList([previous] if previous is not None else [])
        self.block = block

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        for prev in self.previous:  # at most one: its MLP sublayer only
            x = x + prev.ls2(prev.mlp(prev.norm2(x)))  # [B, N, D]
        return x + self.block.ls1(self.block.attn(self.block.norm1(x)))  # [B, N, D]


def _layer_scale_gain(layer_scale: nn.Module) -> torch.Tensor | float:
    """The elementwise gain of timm's LayerScale (1 when the block has none)."""
    return layer_scale.gamma if hasattr(layer_scale, "gamma") else 1.0


class VitTransitionView(TransitionViewBase):
    """The frozen teacher: ``embed``, ``transition(t, x) -> (mean, raw variance)``, ``readout``."""

    def __init__(self, backbone: ImageClassifier) -> None:
        super().__init__()
        vit = backbone.vit
        self.embedding = VitEmbedding(backbone)
        self.readout_head = VitReadout(vit)
        self.blocks = vit.blocks
        self.num_steps = len(vit.blocks)
        self.dim = vit.embed_dim
        self.num_heads = vit.blocks[0].attn.num_heads

    def embed(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.embedding(pixels)  # [B, N, D]

    def prefix(self, num_transitions: int) -> VitPrefix:
        """Transitions 1..num_transitions as one deterministic module sharing the backbone's weights."""
        return VitPrefix(self.blocks, num_transitions)

    def step_module(self, t: int) -> VitTransition:
        return VitTransition(self.blocks[t - 2] if t > 1 else None, self.blocks[t - 1])

    def feed_forward(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        block: Block = self.blocks[layer - 1]
        return x + block.ls2(block.mlp(block.norm2(x)))  # [B, N, D]

    def attention_step(
        self, layer: int, x: torch.Tensor, key_padding_mask: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        block: Block = self.blocks[layer - 1]
        out, variance = attention_with_mixture_variance(block.attn, block.norm1(x), key_padding_mask)
        gain = _layer_scale_gain(block.ls1)
        mean = x + out * gain  # [B, N, D]
        return mean, variance * (gain * gain if isinstance(gain, float) else gain.float().square())

    def readout(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        del key_padding_mask  # every patch is real
        return self.readout_head(x)  # [B, C]
