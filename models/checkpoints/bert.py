"""Text converters: a Hugging Face BERT-family classifier or bare encoder as a transformers ``BertModel`` inside
``TextClassifier`` (view: ``BertTransitionView``), and the spec that rebuilds it."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    BertModel,
    CamembertForSequenceClassification,
    CamembertModel,
    DistilBertForSequenceClassification,
    DistilBertModel,
    ElectraForSequenceClassification,
    ElectraModel,
    PreTrainedModel,
    RobertaForSequenceClassification,
    RobertaModel,
    XLMRobertaForSequenceClassification,
    XLMRobertaModel,
)

from models.checkpoints.common import checked_gelu, copy_linear, ordered_labels
from models.text_backbones import POOLINGS, ClassifierHead, Pooling, TextClassifier

TEXT_SPEC_FORMAT = "director.text-classifier/1"

# sequence classifiers and bare encoders by family; RoBERTa's relatives share its module layout
SEQUENCE_CLASSIFIERS: dict[type, str] = {
    BertForSequenceClassification: "bert",
    RobertaForSequenceClassification: "roberta",
    XLMRobertaForSequenceClassification: "roberta",
    CamembertForSequenceClassification: "roberta",
    ElectraForSequenceClassification: "electra",
    DistilBertForSequenceClassification: "distilbert",
}
ENCODERS: dict[type, str] = {
    BertModel: "bert",
    RobertaModel: "roberta",
    XLMRobertaModel: "roberta",
    CamembertModel: "roberta",
    ElectraModel: "electra",
    DistilBertModel: "distilbert",
}


def _check_encoder_config(config: Any, where: str) -> None:
    if getattr(config, "is_decoder", False) or getattr(config, "add_cross_attention", False):
        raise ValueError(f"{where}: only bidirectional encoders without cross-attention are supported")
    if getattr(config, "position_embedding_type", "absolute") != "absolute":
        raise ValueError(f"{where}: only absolute position embeddings are supported")


def _bert_config(encoder: PreTrainedModel, family: str, attn_implementation: str) -> tuple[BertConfig, int]:
    """The ``BertConfig`` equal to ``encoder``'s and the first position row to copy (RoBERTa's padding offset)."""
    config, where = encoder.config, type(encoder).__name__
    _check_encoder_config(config, where)
    if family == "distilbert":
        fields = {"vocab_size": config.vocab_size, "hidden_size": config.dim, "num_hidden_layers": config.n_layers,
                  "num_attention_heads": config.n_heads, "intermediate_size": config.hidden_dim,
                  "hidden_act": config.activation, "hidden_dropout_prob": config.dropout,
                  "attention_probs_dropout_prob": config.attention_dropout, "type_vocab_size": 1,
                  "max_position_embeddings": config.max_position_embeddings, "pad_token_id": config.pad_token_id,
                  "initializer_range": config.initializer_range, "layer_norm_eps": encoder.embeddings.LayerNorm.eps}
        offset = 0
    else:
        if family == "electra" and config.embedding_size != config.hidden_size:
            raise ValueError(f"{where}: embedding_size {config.embedding_size} != hidden_size {config.hidden_size} "
                             "needs ELECTRA's embedding projection (embeddings_project), which BertModel cannot hold; "
                             "supported: ELECTRA with embedding_size == hidden_size (e.g. the base/large "
                             "discriminators)")
        offset = encoder.embeddings.padding_idx + 1 if family == "roberta" else 0
        fields = {key: getattr(config, key) for key in (
            "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "hidden_act",
            "hidden_dropout_prob", "attention_probs_dropout_prob", "type_vocab_size", "initializer_range",
            "layer_norm_eps", "pad_token_id")}
        fields["max_position_embeddings"] = config.max_position_embeddings - offset
    if not isinstance(fields["hidden_act"], str):
        raise ValueError(f"{where}: the activation must be named in the config, got {fields['hidden_act']!r}")
    if fields["hidden_size"] % fields["num_attention_heads"]:
        raise ValueError(f"{where}: hidden size {fields['hidden_size']} is not a multiple of the heads")
    return BertConfig(**fields, attn_implementation=attn_implementation), offset


def _distilbert_state(encoder: DistilBertModel) -> dict[str, torch.Tensor]:
    """DistilBERT's weights under ``BertModel`` keys; its missing token-type table is one zero row."""
    emb = encoder.embeddings
    state = {"embeddings.word_embeddings.weight": emb.word_embeddings.weight,
             "embeddings.position_embeddings.weight": emb.position_embeddings.weight,
             "embeddings.token_type_embeddings.weight": torch.zeros(1, emb.word_embeddings.embedding_dim),
             "embeddings.LayerNorm.weight": emb.LayerNorm.weight, "embeddings.LayerNorm.bias": emb.LayerNorm.bias}
    for i, block in enumerate(encoder.transformer.layer):
        attn = block.attention
        pairs = {"attention.self.query": attn.q_lin, "attention.self.key": attn.k_lin,
                 "attention.self.value": attn.v_lin, "attention.output.dense": attn.out_lin,
                 "attention.output.LayerNorm": block.sa_layer_norm, "intermediate.dense": block.ffn.lin1,
                 "output.dense": block.ffn.lin2, "output.LayerNorm": block.output_layer_norm}
        for target, module in pairs.items():
            state[f"encoder.layer.{i}.{target}.weight"] = module.weight
            state[f"encoder.layer.{i}.{target}.bias"] = module.bias
    return state


def _layer_norm_eps(encoder: PreTrainedModel) -> set[float]:
    return {float(m.eps) for m in encoder.modules() if isinstance(m, nn.LayerNorm)}


def _convert_encoder(encoder: PreTrainedModel, family: str, attn_implementation: str) -> BertModel:
    """``encoder`` as a ``BertModel`` without pooler, weights copied exactly (strict load)."""
    where = type(encoder).__name__
    config, offset = _bert_config(encoder, family, attn_implementation)
    if family == "distilbert":
        state = _distilbert_state(encoder)
    else:
        state = {k: v for k, v in encoder.state_dict().items() if not k.startswith("pooler.")}
        position = "embeddings.position_embeddings.weight"
        state[position] = state[position][offset:]  # RoBERTa: real token i sits at row padding_idx + 1 + i
    target = BertModel(config, add_pooling_layer=False)
    try:
        target.load_state_dict({k: v.detach().clone() for k, v in state.items()}, strict=True)
    except RuntimeError as err:
        raise ValueError(f"{where}: its weights do not fit BertModel: {err}") from err
    if _layer_norm_eps(encoder) != {float(config.layer_norm_eps)}:
        raise ValueError(f"{where}: the LayerNorms must share one epsilon, got {sorted(_layer_norm_eps(encoder))}")
    source_act = (encoder.transformer.layer[0].ffn.activation if family == "distilbert"
                  else encoder.encoder.layer[0].intermediate.intermediate_act_fn)
    wanted = checked_gelu(source_act, f"{where} ({config.hidden_act!r}; the scriptable text layers)")
    if checked_gelu(target.encoder.layer[0].intermediate.intermediate_act_fn, where) != wanted:
        raise ValueError(f"{where}: activation {config.hidden_act!r} does not rebuild as the same GELU")
    return target


def _hf_head(model: PreTrainedModel, family: str) -> ClassifierHead:
    """The sequence-classification head as a ``ClassifierHead`` (copied weights)."""
    if family == "bert":
        pooler = model.bert.pooler
        if pooler is None:
            raise ValueError("BertForSequenceClassification without its pooler is not supported")
        return ClassifierHead(copy_linear(model.classifier), copy_linear(pooler.dense), "tanh")
    if family == "roberta":
        return ClassifierHead(copy_linear(model.classifier.out_proj), copy_linear(model.classifier.dense), "tanh")
    if family == "electra":
        head = model.classifier
        if checked_gelu(head.activation, type(model).__name__) != "none":
            raise ValueError(f"{type(model).__name__}: the head's GELU must be exact")
        return ClassifierHead(copy_linear(head.out_proj), copy_linear(head.dense), "gelu")
    return ClassifierHead(copy_linear(model.classifier), copy_linear(model.pre_classifier), "relu")


def _classifier_dropout(config: Any, family: str) -> float:
    if family == "distilbert":
        return float(config.seq_classif_dropout)
    dropout = getattr(config, "classifier_dropout", None)
    return float(config.hidden_dropout_prob if dropout is None else dropout)


def bert_family_from_hf(model: PreTrainedModel, num_classes: int | None = None, attn_implementation: str = "eager",
                        pooling: Pooling = "cls") -> tuple[TextClassifier, list[str] | None]:
    """A Hugging Face BERT-family classifier as the canonical ``TextClassifier``: a ``BertModel`` (no pooler) with
    the encoder's weights mapped and a ``ClassifierHead`` copied from the model's head, [CLS] pooling.

    Supported: ``BertForSequenceClassification`` (pooler dense + tanh, classifier), ``RobertaForSequenceClassification``
    and its XLM-RoBERTa / CamemBERT twins (dense, tanh, out_proj on <s>), ``DistilBertForSequenceClassification``
    (pre_classifier, ReLU, classifier; no token-type table, so a zero row; ``q_lin``... mapped onto BERT's names) and
    ``ElectraForSequenceClassification`` with ``embedding_size == hidden_size`` (dense, GELU, out_proj). A bare encoder
    (``BertModel``, ``RobertaModel``, ``DistilBertModel``, ``ElectraModel``, ...) needs ``num_classes`` and gets a
    fresh linear head (to be fitted) with ``pooling``. The encoder's activation must be a GELU.

    RoBERTa numbers positions from ``padding_idx + 1`` and skips pad tokens; the copy keeps rows
    ``padding_idx + 1...``, so it is exact for right-padded inputs whose real tokens start at position 0 and never
    equal the pad id (what its tokenizer produces); pad positions differ but are never attended or pooled.
    Labels: ``config.id2label`` in index order for a classifier, None for a bare encoder.
    """
    if pooling not in POOLINGS:
        raise ValueError(f"unknown pooling {pooling!r}; expected one of {POOLINGS}")
    kind = type(model)
    if kind in SEQUENCE_CLASSIFIERS:
        family = SEQUENCE_CLASSIFIERS[kind]
        labels = model.config.num_labels
        if num_classes is not None and num_classes != labels:
            raise ValueError(f"{kind.__name__} has {labels} labels, got num_classes={num_classes}")
        if pooling != "cls":
            raise ValueError(f"{kind.__name__}'s head reads the first token: pooling must be 'cls'")
        encoder = _convert_encoder(model.base_model, family, attn_implementation)
        head = _hf_head(model, family)
        classifier = TextClassifier(encoder, labels, "cls", _classifier_dropout(model.config, family), head)
        return classifier.eval(), ordered_labels(model.config.id2label, labels)
    if kind in ENCODERS:
        if num_classes is None:
            raise ValueError(f"a bare {kind.__name__} needs num_classes for its fresh head")
        family = ENCODERS[kind]
        encoder = _convert_encoder(model, family, attn_implementation)
        dropout = float(model.config.dropout if family == "distilbert" else model.config.hidden_dropout_prob)
        return TextClassifier(encoder, num_classes, pooling, dropout).eval(), None
    supported = sorted(k.__name__ for k in (*SEQUENCE_CLASSIFIERS, *ENCODERS))
    raise ValueError(f"{kind.__name__} is not supported; supported: {', '.join(supported)}")


def text_classifier_spec(model: TextClassifier) -> dict[str, Any]:
    """What ``text_classifier_from_spec`` needs besides the state dict (JSON-able): the encoder's ``BertConfig``
    dict and attention implementation, pooling, dropout, and the head's shape and activation."""
    head = model.head
    if isinstance(head, nn.Linear):
        head_spec = {"linear": True, "pre_features": None, "pre_bias": False, "activation": "none",
                     "out_bias": head.bias is not None}
    else:
        pre = head.pre if isinstance(head.pre, nn.Linear) else None
        head_spec = {"linear": False, "pre_features": None if pre is None else pre.out_features,
                     "pre_bias": pre is not None and pre.bias is not None, "activation": head.activation,
                     "out_bias": head.out.bias is not None}
    config = model.encoder.config
    return {"format": TEXT_SPEC_FORMAT, "bert_config": config.to_dict(),
            "attn_implementation": config._attn_implementation or "eager", "pooling": model.pooling,
            "dropout": float(model.dropout.p), "num_classes": model.num_classes, "head": head_spec}


def text_classifier_from_spec(spec: dict[str, Any], attn_implementation: str | None = None) -> TextClassifier:
    """A randomly initialised ``TextClassifier`` with the layout ``text_classifier_spec`` recorded (eval mode): load
    the saved state dict into it. ``attn_implementation`` overrides the recorded one."""
    if spec.get("format") != TEXT_SPEC_FORMAT:
        raise ValueError(f"not a text classifier spec (format {spec.get('format')!r}, expected {TEXT_SPEC_FORMAT!r})")
    config = BertConfig.from_dict(spec["bert_config"])
    config._attn_implementation = attn_implementation or spec["attn_implementation"]
    encoder = BertModel(config, add_pooling_layer=False)
    head_spec, num_classes = spec["head"], int(spec["num_classes"])
    head = None
    if not head_spec["linear"]:
        width = head_spec["pre_features"]
        pre = None if width is None else nn.Linear(config.hidden_size, width, bias=head_spec["pre_bias"])
        out = nn.Linear(config.hidden_size if width is None else width, num_classes, bias=head_spec["out_bias"])
        head = ClassifierHead(out, pre, head_spec["activation"])
    model = TextClassifier(encoder, num_classes, spec["pooling"], float(spec["dropout"]), head)
    if head is None and not head_spec["out_bias"]:
        model.head = nn.Linear(config.hidden_size, num_classes, bias=False)
    return model.eval()
