"""A post-LN BERT-family encoder (transformers ``BertModel``) re-read as T transitions that each end with
attention (docs/method.md).

``X_0`` is the token + position + segment embedding after its LayerNorm; transition 1 is layer 1's attention
sublayer including its residual LayerNorm; transition t > 1 runs layer t-1's feed-forward sublayer (intermediate
dense + activation, output dense, residual LayerNorm) then layer t's attention sublayer, so ``X_t`` is the
output of layer t's attention sublayer. The readout is the last feed-forward sublayer, pooling and the head (linear,
or the dense -> activation -> linear head of a converted Hugging Face classifier).
Dropout is never applied: the view is the frozen teacher in eval mode.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import BertModel
from transformers.models.bert.modeling_bert import BertLayer

from models.observed_variance import mixture_attention, post_layernorm_variance
from models.text_backbones import ClassifierHead, TextClassifier, pool_tokens
from models.text_layers import TextPrefix, text_transition
from models.transition_view import TransitionViewBase


def _check_supported(encoder: BertModel) -> None:
    config = encoder.config
    if config.is_decoder or config.add_cross_attention:
        raise ValueError("the BERT view supports bidirectional encoders without cross-attention")
    if getattr(config, "position_embedding_type", "absolute") != "absolute":
        raise ValueError("the BERT view supports absolute position embeddings only")


class BertEmbedding(nn.Module):
    """input_ids [B, L] -> X_0 [B, L, D]: word + absolute position + segment-0 embedding, then LayerNorm."""

    def __init__(self, encoder: BertModel) -> None:
        super().__init__()
        self.embeddings = encoder.embeddings

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        emb = self.embeddings
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)  # [L]
        x = emb.word_embeddings(input_ids) + emb.position_embeddings(positions)  # [B, L, D]
        x = x + emb.token_type_embeddings.weight[0]  # [B, L, D] one segment
        return emb.LayerNorm(x)  # [B, L, D]


def feed_forward(layer: BertLayer, x: torch.Tensor) -> torch.Tensor:
    """Layer ``layer``'s feed-forward sublayer with its residual LayerNorm: [B, L, D] -> [B, L, D]."""
    hidden = layer.intermediate(x)  # [B, L, F] dense + activation
    return layer.output.LayerNorm(layer.output.dense(hidden) + x)  # [B, L, D]


class BertReadout(nn.Module):
    """X_T [B, L, D] -> logits [B, C]: the last feed-forward sublayer, pooling over real tokens, head (the classifier's
    own module, shared: an ``nn.Linear`` or a ``ClassifierHead`` with its dense layer and activation)."""

    def __init__(self, classifier: TextClassifier) -> None:
        super().__init__()
        self.last_layer: BertLayer = classifier.encoder.encoder.layer[-1]
        self.pooling = classifier.pooling
        self.dropout = classifier.dropout
        self.head: nn.Linear | ClassifierHead = classifier.head

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        h = feed_forward(self.last_layer, x)  # [B, L, D] = last_hidden_state
        return self.head(self.dropout(pool_tokens(h, key_padding_mask, self.pooling)))  # [B, C]


class BertTransitionView(TransitionViewBase):
    """The frozen teacher: ``embed``, ``transition(t, x, key_padding_mask) -> (mean, raw variance)``, ``readout``.

    ``key_padding_mask`` is [B, L] bool, True for real tokens (an ``attention_mask`` cast to bool). The variance is
    the hard-attention mixture variance through W_O (``mixture_attention``), carried through the attention
    sublayer's post-LN LayerNorm as gain^2 / the token's variance (``post_layernorm_variance``).
    """

    def __init__(self, classifier: TextClassifier) -> None:
        super().__init__()
        encoder = classifier.encoder
        _check_supported(encoder)
        self.embedding = BertEmbedding(encoder)
        self.layers = encoder.encoder.layer
        self.readout_head = BertReadout(classifier)
        self.num_steps = len(self.layers)
        self.dim = encoder.config.hidden_size
        self.num_heads = encoder.config.num_attention_heads

    def embed(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """X_0 [B, L, D]. BERT's positions are absolute, so with right padding ``attention_mask`` changes nothing
        here; it is taken for the same call shape as the rest of the text path."""
        del attention_mask
        return self.embedding(input_ids)  # [B, L, D]

    def prefix(self, num_transitions: int) -> TextPrefix:
        """Transitions 1..num_transitions as one deterministic plain module (copied weights, scriptable)."""
        return TextPrefix.from_bert(self.layers, num_transitions)

    def step_module(self, t: int) -> nn.Module:
        """Transition t as a plain module with copied weights (scriptable)."""
        return text_transition(self.layers, t)

    def feed_forward(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        return feed_forward(self.layers[layer - 1], x)  # [B, L, D]

    def attention_step(
        self, layer: int, x: torch.Tensor, key_padding_mask: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.attention_sublayer(self.layers[layer - 1], x, key_padding_mask)

    def attention_sublayer(
        self, layer: BertLayer, x: torch.Tensor, key_padding_mask: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """LN(x + W_O softmax-attention(x) + b_O) and its variance, [B, L, D] each."""
        attn = layer.attention.self
        batch, tokens, _ = x.shape
        heads, head_dim = attn.num_attention_heads, attn.attention_head_size

        def split_heads(y: torch.Tensor) -> torch.Tensor:
            return y.view(batch, tokens, heads, head_dim).transpose(1, 2)  # [B, H, L, hd]

        q, k, v = split_heads(attn.query(x)), split_heads(attn.key(x)), split_heads(attn.value(x))
        out_proj = layer.attention.output
        mixed, variance = mixture_attention(q, k, v, out_proj.dense.weight, attn.scaling, key_padding_mask)
        pre_norm = out_proj.dense(mixed.to(x.dtype)) + x  # [B, L, D]
        mean = out_proj.LayerNorm(pre_norm)  # [B, L, D]
        return mean, post_layernorm_variance(variance, pre_norm, out_proj.LayerNorm)

    def readout(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.readout_head(x, key_padding_mask)  # [B, C]

    def final_hidden(self, x: torch.Tensor) -> torch.Tensor:
        """X_T [B, L, D] -> the encoder's ``last_hidden_state`` (the last feed-forward sublayer)."""
        return feed_forward(self.layers[-1], x)  # [B, L, D]
