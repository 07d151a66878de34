"""The DIRECTOR transition kernel ``p_theta(X_t | X_{t-1}) = N(x + MeanHead(h), exp(VarHead(h)))``: one DiT block
(facebookresearch/DiT: ``TimestepEmbedder``, ``modulate``, one ``initialize_weights``) with adaLN-Zero, conditioned
only on the step t, one kernel for all T steps; ``KernelConfig`` is what builds one."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

import torch
from timm.layers import Attention, Mlp
from torch import nn
from torch.nn import functional as F


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)  # [R, N, D]


def soft_clamp(x: torch.Tensor, low: torch.Tensor, high: torch.Tensor, sharpness: float = 4.0) -> torch.Tensor:
    """Smooth bounds: ``high - softplus(high - x)`` then ``low + softplus(y - low)`` (softplus of the given
    sharpness). The result is strictly above ``low``, exceeds ``high`` by at most
    ``log(1 + exp(-sharpness (high - low))) / sharpness``, moves values more than ~1.5 nats inside the bounds
    by < 1e-3, and its gradient never reaches exactly zero at either edge."""
    y = high - F.softplus(high - x, beta=sharpness)
    return low + F.softplus(y - low, beta=sharpness)


def attention_mask(key_padding_mask: torch.Tensor | None, causal: bool, tokens: int, device: torch.device
                   ) -> torch.Tensor | None:
    """The kernel attention's boolean mask (True = attend): padding keys masked [R, 1, 1, N], and for a decoder's kernel
    token i attends to tokens j <= i only [1, 1, N, N]; None when neither applies."""
    mask: torch.Tensor | None = None
    if key_padding_mask is not None:
        mask = key_padding_mask[:, None, None, :]  # [R, 1, 1, N]
    if causal:
        past = torch.ones(tokens, tokens, dtype=torch.bool, device=device).tril()[None, None]  # [1, 1, N, N]
        mask = past if mask is None else mask & past  # [R or 1, 1, N, N]
    return mask


class TimestepEmbedder(nn.Module):
    """Sinusoidal embedding of the (integer) step followed by a two-layer MLP."""

    def __init__(self, hidden_size: int, frequency_embedding_size: int = 64) -> None:
        super().__init__()
        self.frequency_embedding_size = frequency_embedding_size
        self.mlp = nn.Sequential(
            nn.Linear(frequency_embedding_size, hidden_size),
            nn.SiLU(),
            nn.Linear(hidden_size, hidden_size),
        )

    @staticmethod
    def timestep_embedding(t: torch.Tensor, dim: int, max_period: float = 10000.0) -> torch.Tensor:
        half = dim // 2
        freqs = torch.exp(
            -math.log(max_period) * torch.arange(half, dtype=torch.float32, device=t.device) / half
        )  # [half]
        args = t.float()[:, None] * freqs[None]  # [K, half]
        return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)  # [K, dim]

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.timestep_embedding(t, self.frequency_embedding_size))  # [K, D]


class TransitionKernel(nn.Module):
    """One adaLN-Zero DiT block with a mean head (residual) and a log-variance head (soft-clamped)."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        depth: int,
        mlp_ratio: float = 1.0,
        logvar_init: float = 0.0,
        logvar_min: torch.Tensor | None = None,
        logvar_max: torch.Tensor | None = None,
        frequency_embedding_size: int = 64,
        causal: bool = False,
    ) -> None:
        super().__init__()
        self.dim = dim
        self.num_steps = depth  # K; the scripted attribute keeps the name exported artifacts carry
        self.causal = causal  # a decoder's kernel: token i attends to tokens j <= i only, like its teacher
        self.t_embedder = TimestepEmbedder(dim, frequency_embedding_size)
        # 6 block modulations (DiT) + shift/scale of the output norm shared by both heads
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(dim, 8 * dim))
        self.norm1 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.attn = Attention(dim, num_heads=num_heads, qkv_bias=True)
        self.norm2 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.mlp = Mlp(dim, hidden_features=int(dim * mlp_ratio), act_layer=lambda: nn.GELU(approximate="tanh"))
        self.norm_final = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.mean_head = nn.Linear(dim, dim)
        self.var_head = nn.Linear(dim, dim)
        low = logvar_min if logvar_min is not None else torch.full((depth,), -30.0)
        high = logvar_max if logvar_max is not None else torch.full((depth,), 30.0)
        self.register_buffer("logvar_min", low.detach().clone().float().reshape(depth))
        self.register_buffer("logvar_max", high.detach().clone().float().reshape(depth))
        self.initialize_weights(logvar_init)

    def initialize_weights(self, logvar_init: float) -> None:
        """Fresh kernel = identity mean map and the observed variance level (docs/method.md)."""

        def _basic_init(module: nn.Module) -> None:
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)

        self.apply(_basic_init)
        nn.init.normal_(self.t_embedder.mlp[0].weight, std=0.02)
        nn.init.normal_(self.t_embedder.mlp[2].weight, std=0.02)
        nn.init.zeros_(self.adaLN_modulation[-1].weight)
        nn.init.zeros_(self.adaLN_modulation[-1].bias)
        nn.init.zeros_(self.mean_head.weight)
        nn.init.zeros_(self.mean_head.bias)
        nn.init.zeros_(self.var_head.weight)
        nn.init.constant_(self.var_head.bias, logvar_init)

    def conditioning(self, steps: torch.Tensor) -> torch.Tensor:
        """Steps [K] (1..T) -> adaLN modulation [K, 8D]; depends on t only, so it can be precomputed."""
        return self.adaLN_modulation(self.t_embedder(steps))  # [K, 8D]

    def forward_conditioned(
        self,
        x: torch.Tensor,
        modulation: torch.Tensor,
        step_index: torch.Tensor,
        key_padding_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x [R, N, D], modulation [R or 1, 8D], step_index [R or 1] (0-based) -> mean, logvar [R, N, D]."""
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp, shift_out, scale_out = modulation.chunk(
            8, dim=-1
        )  # each [R, D]
        attn_mask = attention_mask(key_padding_mask, self.causal, x.shape[1], x.device)
        h = x + gate_msa.unsqueeze(1) * self.attn(modulate(self.norm1(x), shift_msa, scale_msa), attn_mask)
        h = h + gate_mlp.unsqueeze(1) * self.mlp(modulate(self.norm2(h), shift_mlp, scale_mlp))  # [R, N, D]
        h = modulate(self.norm_final(h), shift_out, scale_out)  # [R, N, D]
        mean = x + self.mean_head(h)  # [R, N, D]
        low = self.logvar_min[step_index].view(-1, 1, 1)  # [R or 1, 1, 1]
        high = self.logvar_max[step_index].view(-1, 1, 1)
        logvar = soft_clamp(self.var_head(h), low, high)  # [R, N, D]
        return mean, logvar

    def step_moments(self, x: torch.Tensor, t: int, key_padding_mask: torch.Tensor | None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """x [R, N, D], every row at step t (1..K) -> mean, logvar [R, N, D] (``FoldedKernel`` gives the same from
        folded weights)."""
        steps = torch.full((1,), t, dtype=torch.long, device=x.device)
        return self.forward_conditioned(x, self.conditioning(steps), steps - 1, key_padding_mask)

    def forward(
        self, x: torch.Tensor, steps: torch.Tensor, key_padding_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x [R, N, D], steps [R] in 1..T -> mean, logvar [R, N, D]."""
        return self.forward_conditioned(x, self.conditioning(steps), steps - 1, key_padding_mask)

    @classmethod
    def from_config(cls, config: KernelConfig) -> TransitionKernel:
        """The kernel a saved or freshly decided config describes (its weights initialised, as a fresh kernel's)."""
        return cls(dim=config.dim, num_heads=config.num_heads, depth=config.depth, mlp_ratio=config.mlp_ratio,
                   logvar_init=config.logvar_init, logvar_min=config.logvar_min, logvar_max=config.logvar_max,
                   frequency_embedding_size=config.frequency_embedding_size, causal=config.causal)


@dataclass(frozen=True, eq=False)
class KernelConfig:
    """What builds a ``TransitionKernel``, decided once where distillation sizes the kernel and saved beside its
    weights, so whatever loads a checkpoint rebuilds the same module without knowing how it was sized."""

    dim: int
    num_heads: int
    depth: int  # K, the diffused transitions: one conditioning and one pair of log-variance bounds per step
    mlp_ratio: float = 1.0
    frequency_embedding_size: int = 64
    causal: bool = False  # a decoder's kernel attends like its teacher: token i to tokens j <= i only
    logvar_init: float = 0.0  # a fresh kernel's log-variance (the observed level)
    logvar_min: torch.Tensor | None = None  # [K]; None: -30
    logvar_max: torch.Tensor | None = None  # [K]; None: 30

    def __post_init__(self) -> None:
        for name in ("logvar_min", "logvar_max"):
            bound = getattr(self, name)
            if bound is not None and bound.numel() != self.depth:
                raise ValueError(f"{name} has {bound.numel()} entries for {self.depth} steps")

    def document(self) -> dict[str, Any]:
        """The config as a plain dict (bounds as CPU tensors), what a checkpoint stores: loading it back needs no
        class from this module."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return {k: v.detach().cpu() if isinstance(v, torch.Tensor) else v for k, v in values.items()}

    @classmethod
    def from_document(cls, document: dict[str, Any]) -> KernelConfig:
        """The config of ``document``; older checkpoints stored the constructor's arguments, with the depth under
        ``num_steps`` and no ``causal``."""
        values = dict(document)
        if "num_steps" in values:
            values["depth"] = values.pop("num_steps")
        return cls(**values)
