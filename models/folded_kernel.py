"""The transition kernel as an inference artifact carries it: each step's adaLN modulation folded into that step's own
weights (docs/method.md, "The kernel, folded for serving").

The conditioning depends on the step t only, so for each of the K steps the modulation is a constant. A shift and
scale after a norm without affine fold into the linear layer that reads it (``W (n * (1 + s) + b) + c`` is
``(W diag(1 + s)) n + (W b + c)``), a gate before the residual folds into the layer that writes it
(``g * (W y + c)`` is ``(diag(g) W) y + g * c``), and the mean and log-variance heads read the same modulated features,
so they become one linear layer of twice the width. What is left per step is three norms, attention, the feed-forward
pair and one head: no modulation arithmetic, no step embedder, no adaLN MLP.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from models.kernel import TransitionKernel, attention_mask, soft_clamp


def scaled_input(weight: torch.Tensor, bias: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """A linear layer ``weight`` [O, I], ``bias`` [O] reading ``n * (1 + scale) + shift`` per step (shift, scale
    [K, I]) -> per-step weights [K, O, I] and biases [K, O] reading ``n``."""
    folded_weight = weight[None] * (1 + scale)[:, None, :]  # [K, O, I]
    folded_bias = shift @ weight.T + bias[None]  # [K, O]
    return folded_weight, folded_bias


def gated_output(weight: torch.Tensor, bias: torch.Tensor, gate: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A linear layer ``weight`` [O, I], ``bias`` [O] whose output is multiplied by ``gate`` [K, O] per step -> per-step
    weights [K, O, I] and biases [K, O]."""
    return gate[:, :, None] * weight[None], gate * bias[None]  # [K, O, I], [K, O]


def frozen(tensor: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(tensor.detach().clone().contiguous(), requires_grad=False)


class FoldedKernel(nn.Module):
    """``TransitionKernel``'s inference: ``step_moments(x, t, mask)`` gives the same mean and log-variance from per-step
    folded weights (stacked [K, ...], step t reads entry t - 1)."""

    def __init__(self, kernel: TransitionKernel) -> None:
        super().__init__()
        self.num_steps = kernel.num_steps
        self.dim = kernel.dim
        self.num_heads = kernel.attn.num_heads
        self.causal = kernel.causal
        steps = torch.arange(1, self.num_steps + 1, device=kernel.mean_head.weight.device)
        with torch.no_grad():
            modulation = kernel.conditioning(steps).float()  # [K, 8D]
            shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp, shift_out, scale_out = modulation.chunk(
                8, dim=-1)  # each [K, D]
            attn, mlp = kernel.attn, kernel.mlp
            qkv = scaled_input(attn.qkv.weight, attn.qkv.bias, shift_msa, scale_msa)  # [K, 3D, D], [K, 3D]
            proj = gated_output(attn.proj.weight, attn.proj.bias, gate_msa)  # [K, D, D], [K, D]
            fc1 = scaled_input(mlp.fc1.weight, mlp.fc1.bias, shift_mlp, scale_mlp)  # [K, H, D], [K, H]
            fc2 = gated_output(mlp.fc2.weight, mlp.fc2.bias, gate_mlp)  # [K, D, H], [K, D]
            head_weight = torch.cat([kernel.mean_head.weight, kernel.var_head.weight])  # [2D, D]
            head_bias = torch.cat([kernel.mean_head.bias, kernel.var_head.bias])  # [2D]
            heads = scaled_input(head_weight, head_bias, shift_out, scale_out)  # [K, 2D, D], [K, 2D]
        self.qkv_weight, self.qkv_bias = frozen(qkv[0]), frozen(qkv[1])
        self.proj_weight, self.proj_bias = frozen(proj[0]), frozen(proj[1])
        self.fc1_weight, self.fc1_bias = frozen(fc1[0]), frozen(fc1[1])
        self.fc2_weight, self.fc2_bias = frozen(fc2[0]), frozen(fc2[1])
        self.head_weight, self.head_bias = frozen(heads[0]), frozen(heads[1])
        self.register_buffer("logvar_min", kernel.logvar_min.detach().clone())  # [K]
        self.register_buffer("logvar_max", kernel.logvar_max.detach().clone())  # [K]

    def attention(self, x: torch.Tensor, i: int, mask: torch.Tensor | None) -> torch.Tensor:
        """Normalised x [R, N, D] -> step i's gated attention output [R, N, D]."""
        rows, tokens, dim = x.shape
        qkv = F.linear(x, self.qkv_weight[i], self.qkv_bias[i])  # [R, N, 3D]
        q, k, v = qkv.reshape(rows, tokens, 3, self.num_heads, dim // self.num_heads).permute(2, 0, 3, 1, 4).unbind(0)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # [R, H, N, D/H]
        y = y.transpose(1, 2).reshape(rows, tokens, dim)  # [R, N, D]
        return F.linear(y, self.proj_weight[i], self.proj_bias[i])  # [R, N, D]

    def step_moments(self, x: torch.Tensor, t: int, key_padding_mask: torch.Tensor | None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """x [R, N, D] at step t (1..K) -> mean, logvar [R, N, D]."""
        i = t - 1
        dim = self.dim
        mask = attention_mask(key_padding_mask, self.causal, x.shape[1], x.device)
        h = x + self.attention(F.layer_norm(x, [dim], eps=1e-6), i, mask)  # [R, N, D]
        hidden = F.gelu(F.linear(F.layer_norm(h, [dim], eps=1e-6), self.fc1_weight[i], self.fc1_bias[i]),
                        approximate="tanh")  # [R, N, H]
        h = h + F.linear(hidden, self.fc2_weight[i], self.fc2_bias[i])  # [R, N, D]
        out = F.linear(F.layer_norm(h, [dim], eps=1e-6), self.head_weight[i], self.head_bias[i])  # [R, N, 2D]
        logvar = soft_clamp(out[..., dim:], self.logvar_min[i], self.logvar_max[i])  # [R, N, D]
        return x + out[..., :dim], logvar
