"""A post-LN BERT encoder's sublayers as plain, scriptable modules with copied weights (docs/architecture.md).

transformers modules do not script reliably, so the text artifact carries these instead: ``TextFeedForward`` (the
feed-forward sublayer with its residual LayerNorm), ``TextAttention`` (the attention sublayer with its residual
LayerNorm) and ``TextPrefix``, the first transitions of the re-partitioned stack run deterministically (partial
depth, docs/method.md). Each equals its transformers counterpart in eval mode (no dropout).
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.nn import functional as F
from transformers.models.bert.modeling_bert import BertLayer


def gelu_approximation(act: nn.Module) -> str:
    """Which torch GELU (``approximate`` = "none" or "tanh") a BERT intermediate activation module computes,
    told by its values (transformers' activation classes differ between versions); anything else is refused."""
    probe = torch.linspace(-6.0, 6.0, 241)  # [241]
    with torch.no_grad():
        values = act(probe)
    for approximate in ("none", "tanh"):
        if torch.allclose(values, F.gelu(probe, approximate=approximate), atol=1e-6, rtol=0):
            return approximate
    raise ValueError(f"the text layers support GELU activations only, got {type(act).__name__}")


class TextFeedForward(nn.Module):
    """[R, L, D] -> [R, L, D]: dense, GELU, dense, residual LayerNorm."""

    def __init__(self, intermediate: nn.Linear, output: nn.Linear, norm: nn.LayerNorm,
                 gelu_approximate: str = "none") -> None:
        super().__init__()
        self.intermediate = copy.deepcopy(intermediate)
        self.output = copy.deepcopy(output)
        self.norm = copy.deepcopy(norm)
        self.gelu_approximate = gelu_approximate

    @classmethod
    def from_bert(cls, layer: BertLayer) -> TextFeedForward:
        return cls(layer.intermediate.dense, layer.output.dense, layer.output.LayerNorm,
                   gelu_approximation(layer.intermediate.intermediate_act_fn))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = F.gelu(self.intermediate(x), approximate=self.gelu_approximate)  # [R, L, F]
        return self.norm(self.output(hidden) + x)  # [R, L, D]


class TextAttention(nn.Module):
    """[R, L, D] -> [R, L, D]: softmax self-attention over real tokens, output projection, residual LayerNorm."""

    def __init__(self, query: nn.Linear, key: nn.Linear, value: nn.Linear, output: nn.Linear, norm: nn.LayerNorm,
                 num_heads: int) -> None:
        super().__init__()
        self.query = copy.deepcopy(query)
        self.key = copy.deepcopy(key)
        self.value = copy.deepcopy(value)
        self.output = copy.deepcopy(output)
        self.norm = copy.deepcopy(norm)
        self.num_heads = num_heads

    @classmethod
    def from_bert(cls, layer: BertLayer) -> TextAttention:
        attn = layer.attention.self
        return cls(attn.query, attn.key, attn.value, layer.attention.output.dense, layer.attention.output.LayerNorm,
                   attn.num_attention_heads)

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        batch, tokens, dim = x.shape
        split = (batch, tokens, self.num_heads, dim // self.num_heads)
        q = self.query(x).view(split).transpose(1, 2)  # [R, H, L, hd]
        k = self.key(x).view(split).transpose(1, 2)  # [R, H, L, hd]
        v = self.value(x).view(split).transpose(1, 2)  # [R, H, L, hd]
        attn_mask: torch.Tensor | None = None
        if key_padding_mask is not None:
            attn_mask = key_padding_mask[:, None, None, :]  # [R, 1, 1, L] True = attend
        mixed = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)  # [R, H, L, hd]
        mixed = mixed.transpose(1, 2).reshape(batch, tokens, dim)  # [R, L, D]
        return self.norm(self.output(mixed) + x)  # [R, L, D]


class TextTransition(nn.Module):
    """Transition t > 1 of the re-partitioned encoder: layer t-1's feed-forward sublayer, then layer t's attention."""

    def __init__(self, feed_forward: TextFeedForward, attention: TextAttention) -> None:
        super().__init__()
        self.feed_forward = feed_forward
        self.attention = attention

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.attention(self.feed_forward(x), key_padding_mask)  # [B, L, D]


def text_transition(layers: nn.ModuleList, t: int) -> nn.Module:
    """Transition t of a BERT encoder's ``layers`` as a plain module (x, key_padding_mask) -> X_t: layer 1's attention
    sublayer at t = 1, else layer t-1's feed-forward sublayer then layer t's attention."""
    if t == 1:
        return TextAttention.from_bert(layers[0])
    return TextTransition(TextFeedForward.from_bert(layers[t - 2]), TextAttention.from_bert(layers[t - 1]))


class TextPrefix(nn.Module):
    """Transitions 1..P of the re-partitioned encoder, deterministic: X_0 [B, L, D] -> X_P [B, L, D], the output of
    layer P's attention sublayer (layers 1..P-1 whole, then layer P's attention). P = 0 is the identity."""

    def __init__(self, first: list[TextAttention], transitions: list[TextTransition]) -> None:
        super().__init__()
        if len(first) > 1 or (transitions and not first):
            raise ValueError("a prefix starts with layer 1's attention sublayer, then whole transitions")
        self.first = nn.ModuleList(first)
        self.transitions = nn.ModuleList(transitions)

    @classmethod
    def from_bert(cls, layers: nn.ModuleList, num_transitions: int) -> TextPrefix:
        if not 0 <= num_transitions <= len(layers):
            raise ValueError(f"a prefix has 0..{len(layers)} transitions, got {num_transitions}")
        first = [text_transition(layers, 1)] if num_transitions else []
        return cls(first, [text_transition(layers, t) for t in range(2, num_transitions + 1)])

    @property
    def num_transitions(self) -> int:
        return len(self.first) + len(self.transitions)

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        for attention in self.first:
            x = attention(x, key_padding_mask)  # [B, L, D] transition 1
        for transition in self.transitions:
            x = transition(x, key_padding_mask)  # [B, L, D] transitions 2..P
        return x
