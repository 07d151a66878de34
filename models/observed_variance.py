"""The observed transition variance: softmax attention read as a kernel smoother (DESIGN.md section 2).

Token i's attention output is the mean of a mixture over tokens j with weights A_ij; its spread is the
variance of that mixture (hard attention J ~ Cat(A_i)), taken exactly through the output projection.
"""

from __future__ import annotations

import torch
from timm.layers import Attention
from torch import nn


def attention_with_mixture_variance(
    attn: Attention, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run a timm ``Attention`` on (already normalised) ``x`` [B, N, D] and return its output and the
    per-token, per-feature hard-attention mixture variance, both [B, N, D].

    ``key_padding_mask`` is [B, N] bool, True for real tokens. Never E[u^2] - E[u]^2 on raw values: pass one
    centres every value on its sequence's token mean c, pass two takes the weighted second moment of the
    centred values and subtracts the square of their weighted mean (the corrected two-pass form,
    sum_j A_ij (u_j - m_i)^2 = A (u - c)^2 - (A (u - c))^2), with the products in fp64. It equals the
    pairwise-deviation form to fp32 rounding (tested) at a tenth of its cost: no [B, N, N, D] tensor.
    """
    if not isinstance(attn.norm, nn.Identity) or attn.gate is not None:
        raise ValueError("the mixture variance needs a linear map from A @ v to the output (no scale_norm/gate)")
    batch, tokens, _ = x.shape
    heads, head_dim = attn.num_heads, attn.head_dim
    qkv = attn.qkv(x).reshape(batch, tokens, 3, heads, head_dim).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.unbind(0)  # [B, H, N, hd] each
    q, k = attn.q_norm(q), attn.k_norm(k)
    scores = (q.float() * attn.scale) @ k.float().transpose(-2, -1)  # [B, H, N, N]
    if key_padding_mask is not None:
        scores = scores.masked_fill(~key_padding_mask[:, None, None, :], float("-inf"))
    weights = scores.softmax(dim=-1)  # [B, H, N, N]
    mixed = (weights @ v.float()).transpose(1, 2).reshape(batch, tokens, heads * head_dim)  # [B, N, H*hd]
    output = attn.proj(mixed.to(x.dtype))  # [B, N, D]

    w_out = attn.proj.weight.float()  # [D, H*hd]
    w_heads = w_out.view(w_out.shape[0], heads, head_dim).permute(1, 2, 0)  # [H, hd, D]
    u = torch.einsum("bhnk,hkd->bhnd", v.float(), w_heads).double()  # [B, H, N, D] each value through W_O^h
    if key_padding_mask is None:
        shift = u.mean(dim=2, keepdim=True)  # [B, H, 1, D]
    else:
        real = key_padding_mask[:, None, :, None].double()  # [B, 1, N, 1]
        shift = (u * real).sum(dim=2, keepdim=True) / real.sum(dim=2, keepdim=True)  # [B, H, 1, D]
    centred = u - shift  # [B, H, N, D]
    w64 = weights.double()  # [B, H, N, N]
    head_variance = w64 @ centred.square() - (w64 @ centred).square()  # [B, H, N, D]
    return output, head_variance.sum(dim=1).clamp_min(0.0).float()  # heads are independent: variances add


def post_layernorm_variance(variance: torch.Tensor, pre_norm: torch.Tensor, norm: nn.LayerNorm) -> torch.Tensor:
    """Carry a variance through a post-LN residual LayerNorm: scale by gain^2 / the token's variance."""
    token_var = pre_norm.float().var(dim=-1, unbiased=False, keepdim=True) + norm.eps  # [B, N, 1]
    gain = norm.weight.float() if norm.weight is not None else torch.ones_like(variance[0, 0])
    return variance * gain.square() / token_var
