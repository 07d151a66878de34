"""A pre-norm decoder's (transformers Qwen2 / Llama) sublayers as plain, scriptable modules with copied weights
(docs/method.md and docs/architecture.md).

transformers modules do not script reliably, so the decoder view, its prefix, its teacher transitions and the
artifact all run these instead, one implementation: ``RMSNorm``, ``RotaryEmbedding`` (default RoPE only),
``DecoderAttention`` (grouped-query, rotary, causal + key-padding mask, SDPA), ``DecoderMlp`` (SwiGLU), the two
residual sublayers, ``DecoderTransition`` (layer t-1's MLP sublayer, then layer t's attention sublayer),
``DecoderPrefix``, ``DecoderEmbedding`` and ``DecoderReadout`` (last MLP sublayer, final norm, last-real-token
pooling, score head). Each equals its transformers counterpart in eval mode (no dropout) on right-padded input:
positions are 0..L-1 in every row, so a text's tokens start at position 0.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from models.half_storage import WordTable

SILU_ACTIVATIONS: tuple[str, ...] = ("silu", "swish")  # transformers' ACT2FN maps both to SiLU


def rope_settings(config: Any) -> tuple[float, str]:
    """(rope_theta, rope_type) of a transformers decoder config; ``rope_scaling`` of transformers 4 is read too."""
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    theta = params.get("rope_theta", getattr(config, "rope_theta", 10000.0))
    rope_type = params.get("rope_type", params.get("type", "default"))
    return float(theta), str(rope_type if rope_type is not None else "default")


def check_rope(config: Any) -> None:
    """Refuse RoPE variants other than the default (linear, dynamic, yarn, llama3, ... rescale the frequencies)."""
    _, rope_type = rope_settings(config)
    if rope_type not in ("default", "none"):
        raise ValueError(f"the decoder layers support the default rotary embedding only, got rope scaling "
                         f"type {rope_type!r}")


def check_activation(config: Any) -> None:
    act = getattr(config, "hidden_act", "silu")
    if act not in SILU_ACTIVATIONS:
        raise ValueError(f"the decoder layers support the SiLU (SwiGLU) MLP only, got hidden_act {act!r}")


def repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """[B, H_kv, L, hd] -> [B, H_kv * groups, L, hd]: each key/value head repeated for its query heads (GQA)."""
    if groups == 1:
        return x
    batch, heads, tokens, head_dim = x.shape
    x = x[:, :, None].expand(batch, heads, groups, tokens, head_dim)  # [B, H_kv, G, L, hd]
    return x.reshape(batch, heads * groups, tokens, head_dim)  # [B, H, L, hd]


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)  # [.., hd]


def attention_mask(tokens: int, key_padding_mask: torch.Tensor | None, device: torch.device) -> torch.Tensor:
    """The causal mask combined with the key-padding mask ([B, L] True for real tokens): [B or 1, 1, L, L] bool,
    True = attend (key j <= query i and j real)."""
    mask = torch.ones(tokens, tokens, dtype=torch.bool, device=device).tril()[None, None]  # [1, 1, L, L]
    if key_padding_mask is not None:
        mask = mask & key_padding_mask[:, None, None, :]  # [B, 1, L, L]
    return mask


class RMSNorm(nn.Module):
    """[.., D] -> [.., D]: x / rms(x) in float32, cast back to x's dtype, times the gain (as transformers does)."""

    def __init__(self, weight: torch.Tensor, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight.detach().clone())  # [D]
        self.eps = float(eps)

    @classmethod
    def from_hf(cls, norm: nn.Module) -> RMSNorm:
        """Copy a ``Qwen2RMSNorm`` / ``LlamaRMSNorm``."""
        return cls(norm.weight, norm.variance_epsilon)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()  # [.., D]
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)  # [.., D]
        return self.weight * h.to(x.dtype)  # [.., D]


class RotaryEmbedding(nn.Module):
    """The default rotary embedding: x [B, L, ..] -> (cos, sin) [L, hd] for positions 0..L-1, in x's dtype."""

    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))  # [hd / 2]
        self.register_buffer("inv_freq", inv_freq)

    @classmethod
    def from_config(cls, config: Any, head_dim: int) -> RotaryEmbedding:
        check_rope(config)
        theta, _ = rope_settings(config)
        return cls(head_dim, theta)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        positions = torch.arange(x.shape[1], device=x.device, dtype=torch.float)  # [L]
        freqs = positions[:, None] * self.inv_freq.to(x.device)[None, :]  # [L, hd / 2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [L, hd]
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)  # [L, hd] each


class DecoderAttention(nn.Module):
    """[B, L, D] -> [B, L, D]: rotary grouped-query softmax attention, causal over real keys, output projection."""

    def __init__(self, q_proj: nn.Linear, k_proj: nn.Linear, v_proj: nn.Linear, o_proj: nn.Linear,
                 num_heads: int, num_kv_heads: int, head_dim: int, rotary: RotaryEmbedding) -> None:
        super().__init__()
        if num_heads % num_kv_heads:
            raise ValueError(f"{num_heads} query heads do not split into {num_kv_heads} key/value groups")
        self.q_proj = copy.deepcopy(q_proj)
        self.k_proj = copy.deepcopy(k_proj)
        self.v_proj = copy.deepcopy(v_proj)
        self.o_proj = copy.deepcopy(o_proj)
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.groups = num_heads // num_kv_heads
        self.scaling = head_dim**-0.5
        self.rotary = copy.deepcopy(rotary)

    @classmethod
    def from_hf(cls, attn: nn.Module, config: Any) -> DecoderAttention:
        """Copy a ``Qwen2Attention`` / ``LlamaAttention`` (biases as they are: Qwen2 has q/k/v bias)."""
        heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
        return cls(attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, heads, kv_heads, attn.head_dim,
                   RotaryEmbedding.from_config(config, attn.head_dim))

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B, L, D] (normalised) -> q, k, v [B, H, L, hd]: rotary on q and k, k and v repeated to the H heads."""
        batch, tokens, _ = x.shape
        q = self.q_proj(x).view(batch, tokens, self.num_heads, self.head_dim).transpose(1, 2)  # [B, H, L, hd]
        k = self.k_proj(x).view(batch, tokens, self.num_kv_heads, self.head_dim).transpose(1, 2)  # [B, H_kv, L, hd]
        v = self.v_proj(x).view(batch, tokens, self.num_kv_heads, self.head_dim).transpose(1, 2)  # [B, H_kv, L, hd]
        cos, sin = self.rotary(x)  # [L, hd] each
        q = q * cos + rotate_half(q) * sin  # [B, H, L, hd]
        k = k * cos + rotate_half(k) * sin  # [B, H_kv, L, hd]
        return q, repeat_kv(k, self.groups), repeat_kv(v, self.groups)  # [B, H, L, hd] each

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        batch, tokens, _ = x.shape
        q, k, v = self.project(x)  # [B, H, L, hd] each
        mask = attention_mask(tokens, key_padding_mask, x.device)  # [B or 1, 1, L, L]
        mixed = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scaling)  # [B, H, L, hd]
        mixed = mixed.transpose(1, 2).reshape(batch, tokens, self.num_heads * self.head_dim)  # [B, L, H*hd]
        return self.o_proj(mixed)  # [B, L, D]


class DecoderMlp(nn.Module):
    """SwiGLU: [.., D] -> [.., D] = down(silu(gate(x)) * up(x))."""

    def __init__(self, gate_proj: nn.Linear, up_proj: nn.Linear, down_proj: nn.Linear) -> None:
        super().__init__()
        self.gate_proj = copy.deepcopy(gate_proj)
        self.up_proj = copy.deepcopy(up_proj)
        self.down_proj = copy.deepcopy(down_proj)

    @classmethod
    def from_hf(cls, mlp: nn.Module, config: Any) -> DecoderMlp:
        """Copy a ``Qwen2MLP`` / ``LlamaMLP`` (SiLU only)."""
        check_activation(config)
        return cls(mlp.gate_proj, mlp.up_proj, mlp.down_proj)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))  # [.., D]


class DecoderAttentionSublayer(nn.Module):
    """a = x + attn(RMSNorm1(x)): [B, L, D] -> [B, L, D]."""

    def __init__(self, norm: RMSNorm, attn: DecoderAttention) -> None:
        super().__init__()
        self.norm = norm
        self.attn = attn

    @classmethod
    def from_hf(cls, layer: nn.Module, config: Any) -> DecoderAttentionSublayer:
        """Layer ``layer`` (a ``Qwen2DecoderLayer`` / ``LlamaDecoderLayer``)'s attention sublayer."""
        return cls(RMSNorm.from_hf(layer.input_layernorm), DecoderAttention.from_hf(layer.self_attn, config))

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        return x + self.attn(self.norm(x), key_padding_mask)  # [B, L, D]


class DecoderMlpSublayer(nn.Module):
    """h = a + MLP(RMSNorm2(a)): [.., D] -> [.., D], per token."""

    def __init__(self, norm: RMSNorm, mlp: DecoderMlp) -> None:
        super().__init__()
        self.norm = norm
        self.mlp = mlp

    @classmethod
    def from_hf(cls, layer: nn.Module, config: Any) -> DecoderMlpSublayer:
        return cls(RMSNorm.from_hf(layer.post_attention_layernorm), DecoderMlp.from_hf(layer.mlp, config))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))  # [.., D]


class DecoderTransition(nn.Module):
    """Transition t: X_{t-1} [B, L, D] -> X_t = a_t [B, L, D], layer t-1's MLP sublayer (none at t = 1) then layer
    t's attention sublayer."""

    def __init__(self, previous: DecoderMlpSublayer | None, attention: DecoderAttentionSublayer) -> None:
        super().__init__()
        self.previous = nn.ModuleList([previous] if previous is not None else [])
        self.attention = attention

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        for mlp in self.previous:  # at most one
            x = mlp(x)  # [B, L, D] = h_{t-1}
        return self.attention(x, key_padding_mask)  # [B, L, D]


class DecoderPrefix(nn.Module):
    """Transitions 1..P, deterministic: X_0 [B, L, D] -> X_P = a_P [B, L, D] (layers 1..P-1 whole, then layer P's
    attention sublayer). P = 0 is the identity."""

    def __init__(self, transitions: list[DecoderTransition]) -> None:
        super().__init__()
        for t, transition in enumerate(transitions, start=1):
            if (len(transition.previous) == 0) != (t == 1):
                raise ValueError("a prefix starts with layer 1's attention sublayer, then whole transitions")
        self.transitions = nn.ModuleList(transitions)
        self.num_transitions = len(transitions)

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        for transition in self.transitions:
            x = transition(x, key_padding_mask)  # [B, L, D]
        return x


class DecoderEmbedding(WordTable):
    """input_ids [B, L] -> X_0 = h_0 [B, L, D]: the token table alone (positions enter through RoPE).

    The table (``table_dtype``, see ``WordTable``: float32, float16 or int8, as ``TokenEmbedding``'s) is dequantised
    to float32 on lookup; float32 reproduces the decoder's ``embed_tokens`` exactly.
    """

    @classmethod
    def from_hf(cls, embed_tokens: nn.Embedding, table_dtype: str = "float32") -> DecoderEmbedding:
        return cls(embed_tokens.weight, table_dtype)

    def restored(self, table_dtype: str | None, max_positions: int | None = None) -> DecoderEmbedding:
        """This embedding with its table re-stored as ``table_dtype`` (None or the same: itself). ``max_positions``
        is unused (``TokenEmbedding.restored``'s signature): rotary positions have no table to cut."""
        del max_positions
        if table_dtype is None or table_dtype == self.table_dtype:
            return self
        return DecoderEmbedding(self.float_table(), table_dtype)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.words(input_ids)  # [B, L, D]


def last_real_index(key_padding_mask: torch.Tensor | None, batch: int, tokens: int,
                    device: torch.device) -> torch.Tensor:
    """[B]: the index of each row's last real token (right padding; the last index when there is no mask)."""
    if key_padding_mask is None:
        return torch.full((batch,), tokens - 1, dtype=torch.long, device=device)
    return (key_padding_mask.long().sum(dim=1) - 1).clamp_min(0)  # [B]


class DecoderReadout(nn.Module):
    """X_T [R, L, D] -> logits [R, C]: the last MLP sublayer, the final RMSNorm and the score head at each row's last
    real token (``key_padding_mask`` [R, L] True for real tokens, right padding). Every part is per token, so the
    row is picked first and the rest runs on [R, D]."""

    def __init__(self, feed_forward: DecoderMlpSublayer, norm: RMSNorm, head: nn.Linear) -> None:
        super().__init__()
        self.feed_forward = feed_forward
        self.norm = norm
        self.head = copy.deepcopy(head)

    @classmethod
    def from_hf(cls, model: nn.Module) -> DecoderReadout:
        """From a ``Qwen2ForSequenceClassification`` / ``LlamaForSequenceClassification``."""
        decoder = model.model
        last = decoder.layers[decoder.config.num_hidden_layers - 1]
        return cls(DecoderMlpSublayer.from_hf(last, decoder.config), RMSNorm.from_hf(decoder.norm), model.score)

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.head(self.features(x, key_padding_mask))  # [R, C]

    def features(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        """X_T [R, L, D] -> the score head's input [R, D]."""
        rows, tokens, _ = x.shape
        last = last_real_index(key_padding_mask, rows, tokens, x.device)  # [R]
        pooled = x[torch.arange(rows, device=x.device), last]  # [R, D]
        return self.norm(self.feed_forward(pooled))  # [R, D]

    @torch.jit.unused
    def final_layer(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(weight [C, D], bias [C]) with logits = features @ weight.T + bias (a score head without bias: zeros)."""
        bias = self.head.bias if self.head.bias is not None else torch.zeros(self.head.out_features)
        return self.head.weight.detach(), bias.detach()
