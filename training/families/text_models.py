"""Text backbones of the pipeline: built from the config, saved in ``backbone.pt`` as their BERT config plus weights,
and rebuilt from that payload without the pretrained package (docs/method.md, "Data that works offline")."""

from __future__ import annotations

from typing import Any

from transformers import BertConfig, BertModel

from models.text_backbones import TextClassifier, build_tiny_bert, load_minilm_encoder
from training.config import TextConfig

# the classifier trains and evaluates with PyTorch's fused attention; the transition view runs its own attention
ATTENTION = "sdpa"


def build_text_classifier(tcfg: TextConfig, num_classes: int, vocab_size: int) -> TextClassifier:
    """Pretrained MiniLM-L6 (``text.backbone: minilm``) or a random tiny BERT sized to the tokenizer's vocabulary,
    with a fresh classification head."""
    if tcfg.backbone == "minilm":
        encoder = load_minilm_encoder(ATTENTION)
        if vocab_size > encoder.config.vocab_size:
            raise ValueError(f"tokenizer has {vocab_size} tokens, MiniLM's table {encoder.config.vocab_size}")
    elif tcfg.backbone == "tiny":
        tiny = tcfg.tiny
        encoder = build_tiny_bert(hidden_size=tiny.hidden_size, num_layers=tiny.num_layers, num_heads=tiny.num_heads,
                                  intermediate_size=tiny.intermediate_size, vocab_size=vocab_size,
                                  max_positions=max(tcfg.max_length, 8), attn_implementation=ATTENTION)
    else:
        raise ValueError(f"unknown text backbone {tcfg.backbone!r}")
    return TextClassifier(encoder, num_classes, tcfg.pooling, tcfg.dropout)


def text_backbone_payload(model: TextClassifier) -> dict[str, Any]:
    """What ``text_classifier_from_payload`` needs besides the state dict."""
    return {"bert_config": model.encoder.config.to_dict(), "num_classes": model.num_classes,
            "pooling": model.pooling, "dropout": float(model.dropout.p)}


def text_classifier_from_payload(payload: dict[str, Any]) -> TextClassifier:
    """The fitted text classifier of a ``backbone.pt`` payload (weights loaded; the caller sets eval/device)."""
    spec = payload["text_backbone"]
    config = BertConfig.from_dict(spec["bert_config"])
    config._attn_implementation = ATTENTION
    encoder = BertModel(config, add_pooling_layer=False)
    model = TextClassifier(encoder, spec["num_classes"], spec["pooling"], spec["dropout"])
    model.load_state_dict(payload["state_dict"])
    return model
