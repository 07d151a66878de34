"""A pre-norm decoder classifier (transformers ``Qwen2ForSequenceClassification`` / ``LlamaForSequenceClassification``)
re-read as T transitions that each end with attention (docs/method.md).

Layer l does ``a_l = h_{l-1} + Attn_l(RMSNorm1_l(h_{l-1}))`` then ``h_l = a_l + MLP_l(RMSNorm2_l(a_l))``. ``X_0 = h_0``
is the token embedding; transition 1 is layer 1's attention sublayer; transition t > 1 runs layer t-1's MLP sublayer
then layer t's attention sublayer, so ``X_t = a_t``. The readout is the last MLP sublayer, the final RMSNorm, the
state of the last real token and the score head. Attention is causal, grouped-query and rotary; inputs are right
padded with positions 0..L-1 in every row. The view runs the plain modules of ``models.decoder_layers`` (copied
once from the transformers model), so the view, its prefix, its teacher transitions and the artifact share one
implementation.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from models.decoder_layers import (
    DecoderAttentionSublayer,
    DecoderEmbedding,
    DecoderMlpSublayer,
    DecoderPrefix,
    DecoderReadout,
    DecoderTransition,
    check_activation,
    check_rope,
)
from models.observed_variance import mixture_attention
from models.transition_view import TransitionViewBase

DECODER_TYPES: tuple[str, ...] = ("qwen2", "llama")


def check_supported(model: nn.Module) -> None:
    """Refuse (ValueError) what the plain decoder layers do not reproduce exactly."""
    config: Any = model.config
    if config.model_type not in DECODER_TYPES or not hasattr(model, "score"):
        raise ValueError(f"the decoder view supports {DECODER_TYPES} *ForSequenceClassification models, got "
                         f"{type(model).__name__} ({config.model_type!r})")
    layer_types = set(getattr(config, "layer_types", None) or ["full_attention"])
    if getattr(config, "use_sliding_window", False) or layer_types != {"full_attention"}:
        raise ValueError(f"the decoder view supports full causal attention only, got sliding-window attention "
                         f"(use_sliding_window={getattr(config, 'use_sliding_window', False)}, layer types "
                         f"{sorted(layer_types)})")
    check_rope(config)
    check_activation(config)
    if getattr(config, "pretraining_tp", 1) not in (None, 1):
        raise ValueError(f"the decoder view does not support pretraining_tp={config.pretraining_tp}")


class DecoderTransitionView(TransitionViewBase):
    """The frozen teacher: ``embed``, ``transition(t, x, key_padding_mask) -> (mean, raw variance)``, ``readout``.

    ``key_padding_mask`` is [B, L] bool, True for real tokens (an ``attention_mask`` cast to bool). The variance is
    the hard-attention mixture variance through W_O (``mixture_attention``, causal, k/v repeated to the query heads,
    rotary q/k). Pre-norm: the attention output adds to the residual stream as is, so no norm gain enters it.
    The weights are copied in float32 whatever the checkpoint's dtype: a half-precision model's view equals that
    model cast to float32.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        check_supported(model)
        config: Any = model.config
        layers = model.model.layers[: config.num_hidden_layers]
        self.embedding = DecoderEmbedding.from_hf(model.model.embed_tokens)
        self.attention_sublayers = nn.ModuleList(DecoderAttentionSublayer.from_hf(layer, config) for layer in layers)
        self.mlp_sublayers = nn.ModuleList(DecoderMlpSublayer.from_hf(layer, config) for layer in layers)
        self.readout_head = DecoderReadout.from_hf(model)
        self.num_steps = len(layers)
        self.dim = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.float()  # the copies compute in float32 (a bf16 checkpoint is upcast, as the artifact computes)

    def embed(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """X_0 [B, L, D]. Right padding puts every text at positions 0..len-1, so ``attention_mask`` changes nothing
        here; it is taken for the same call shape as the rest of the text path."""
        del attention_mask
        return self.embedding(input_ids)  # [B, L, D]

    def plain_transition(self, t: int) -> DecoderTransition:
        """Transition t (1..T) as a plain module (copied weights, scriptable): (x, key_padding_mask) -> X_t."""
        previous = copy.deepcopy(self.mlp_sublayers[t - 2]) if t > 1 else None
        return DecoderTransition(previous, copy.deepcopy(self.attention_sublayers[t - 1]))

    def prefix(self, num_transitions: int) -> DecoderPrefix:
        """Transitions 1..num_transitions as one deterministic plain module (copied weights, scriptable)."""
        if not 0 <= num_transitions <= self.num_steps:
            raise ValueError(f"a prefix has 0..{self.num_steps} transitions, got {num_transitions}")
        return DecoderPrefix([self.plain_transition(t) for t in range(1, num_transitions + 1)])

    def step_module(self, t: int) -> DecoderTransition:
        return self.plain_transition(t)

    def feed_forward(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        return self.mlp_sublayers[layer - 1](x)  # [B, L, D]

    def attention_step(
        self, layer: int, x: torch.Tensor, key_padding_mask: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        sublayer: DecoderAttentionSublayer = self.attention_sublayers[layer - 1]
        attn = sublayer.attn
        q, k, v = attn.project(sublayer.norm(x))  # [B, H, L, hd] each
        mixed, variance = mixture_attention(q, k, v, attn.o_proj.weight, attn.scaling, key_padding_mask, causal=True)
        mean = x + attn.o_proj(mixed.to(x.dtype))  # [B, L, D] = a_t
        return mean, variance  # [B, L, D] each

    def readout(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.readout_head(x, key_padding_mask)  # [B, C]

    def final_hidden(self, x: torch.Tensor) -> torch.Tensor:
        """X_T [B, L, D] -> the decoder's ``last_hidden_state`` (the last MLP sublayer, then the final RMSNorm)."""
        return self.readout_head.norm(self.readout_head.feed_forward(x))  # [B, L, D]
