"""Users' pretrained classifiers converted exactly into the canonical backbones everything downstream understands:
a timm ``VisionTransformer`` inside ``ImageClassifier`` (view: ``VitTransitionView``) and a transformers ``BertModel``
inside ``TextClassifier`` (view: ``BertTransitionView``).

Every converter returns ``(backbone, labels)``: the backbone in eval mode with the source's weights copied (no shared
storage), and the class names in index order where the source carries them (a Hugging Face ``config.id2label``,
timm's ``pretrained_cfg["label_names"]``), else None. What cannot be represented exactly is refused with a
ValueError that says what is supported, never approximated.

A converted backbone is saved as a JSON-able spec plus its state dict and rebuilt with random weights of the same
layout by ``vit_from_spec`` / ``text_classifier_from_spec``, then ``load_state_dict``.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

import torch
from timm.layers import Attention, LayerScale, Mlp, PatchEmbed
from timm.models.vision_transformer import Block, VisionTransformer
from torch import nn
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    BertModel,
    CamembertForSequenceClassification,
    CamembertModel,
    DeiTForImageClassification,
    DeiTForImageClassificationWithTeacher,
    DistilBertForSequenceClassification,
    DistilBertModel,
    ElectraForSequenceClassification,
    ElectraModel,
    PreTrainedModel,
    RobertaForSequenceClassification,
    RobertaModel,
    ViTForImageClassification,
    XLMRobertaForSequenceClassification,
    XLMRobertaModel,
)

from models.backbones import ImageClassifier
from models.text_backbones import POOLINGS, ClassifierHead, Pooling, TextClassifier
from models.text_layers import gelu_approximation

VIT_SPEC_FORMAT = "director.vit/1"
TEXT_SPEC_FORMAT = "director.text-classifier/1"
LAYER_SCALE_INIT = 1e-5  # any value: the LayerScale gains are weights, loaded with the state dict

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


def _gelu(act: nn.Module, where: str) -> str:
    """``gelu_approximation`` with the model named in the refusal."""
    try:
        return gelu_approximation(act)
    except ValueError as err:
        raise ValueError(f"{where}: only GELU activations (exact or tanh) are supported, got {type(act).__name__}"
                         ) from err


def _copy_linear(linear: nn.Linear) -> nn.Linear:
    """A fresh ``nn.Linear`` holding a copy of ``linear``'s weights (no shared storage, no foreign attributes)."""
    out = nn.Linear(linear.in_features, linear.out_features, bias=linear.bias is not None)
    with torch.no_grad():
        out.weight.copy_(linear.weight)
        if linear.bias is not None:
            out.bias.copy_(linear.bias)
    return out


def _ordered_labels(id2label: dict[Any, str] | None, num_classes: int) -> list[str] | None:
    """``id2label`` as a list in index order (keys may be ints or their strings), None without a full table."""
    if not id2label:
        return None
    table = {int(k): str(v) for k, v in id2label.items()}
    if sorted(table) != list(range(num_classes)):
        return None
    return [table[i] for i in range(num_classes)]


# ----------------------------------------------------------------------------------------------------- vision


def vit_from_spec(spec: dict[str, Any]) -> ImageClassifier:
    """A randomly initialised ``ImageClassifier`` with the layout ``vit_spec`` recorded (eval mode): load the saved
    state dict into it."""
    if spec.get("format") != VIT_SPEC_FORMAT:
        raise ValueError(f"not a ViT spec (format {spec.get('format')!r}, expected {VIT_SPEC_FORMAT!r})")
    kwargs = dict(spec["vit"])
    for key in ("img_size", "patch_size"):
        kwargs[key] = tuple(kwargs[key])
    vit = VisionTransformer(**kwargs, norm_layer=partial(nn.LayerNorm, eps=float(spec["layer_norm_eps"])),
                            act_layer=partial(nn.GELU, approximate=spec["gelu_approximate"]))
    return ImageClassifier(vit, spec["mean"], spec["std"]).eval()


def _norm_eps(norms: Sequence[nn.Module], where: str) -> float:
    """The one epsilon of a ViT's LayerNorms (``Identity`` slots skipped); other norms or mixed epsilons refused."""
    eps: set[float] = set()
    for norm in norms:
        if isinstance(norm, nn.Identity):
            continue
        if not isinstance(norm, nn.LayerNorm) or not norm.elementwise_affine or norm.bias is None:
            raise ValueError(f"{where}: only affine LayerNorms with bias are supported, got {type(norm).__name__}")
        eps.add(float(norm.eps))
    if len(eps) != 1:
        raise ValueError(f"{where}: the LayerNorms must share one epsilon, got {sorted(eps)}")
    return eps.pop()


def _timm_layout(vit: VisionTransformer) -> dict[str, Any]:
    """The ``vit_spec`` fields of a timm ViT (all but mean/std); refuses what ``VitTransitionView`` cannot take or
    ``VisionTransformer(**kwargs)`` cannot rebuild."""
    name = type(vit).__name__
    if type(vit) is not VisionTransformer:
        raise ValueError(f"{name}: only timm's plain VisionTransformer is supported (no distillation token or other "
                         "subclass); the transition view reads [class token] + patches")
    if vit.reg_token is not None:
        raise ValueError(f"{name}: register tokens ({vit.num_reg_tokens}) are not supported by the transition view")
    if vit.dynamic_img_size or vit.no_embed_class or vit.pos_embed is None:
        raise ValueError(f"{name}: the transition view needs a fixed image size and learned position embeddings that "
                         "cover the class token (dynamic_img_size, no_embed_class, pos_embed='none' are not supported)")
    if vit.attn_pool is not None or vit.global_pool not in ("avg", "token") or vit.pool_include_prefix:
        raise ValueError(f"{name}: only 'token' or 'avg' pooling (without prefix tokens) is supported, got "
                         f"{vit.global_pool!r}")
    patch = vit.patch_embed
    if (type(patch) is not PatchEmbed or not isinstance(patch.norm, nn.Identity) or not patch.flatten
            or patch.dynamic_img_pad):
        raise ValueError(f"{name}: only a plain PatchEmbed (no norm, no hybrid stem, no dynamic padding) is supported")
    if not isinstance(vit.head, nn.Linear):
        raise ValueError(f"{name}: a classifier needs a linear head (num_classes > 0)")
    blocks = list(vit.blocks)
    first: Block = blocks[0]
    for block in blocks:
        if type(block) is not Block or type(block.attn) is not Attention or type(block.mlp) is not Mlp:
            raise ValueError(f"{name}: only timm Block / Attention / Mlp layers are supported")
        if not isinstance(block.attn.norm, nn.Identity) or block.attn.gate is not None:
            raise ValueError(f"{name}: attention with scale_norm or a gate is not supported")
        if not isinstance(block.mlp.norm, nn.Identity):
            raise ValueError(f"{name}: an MLP with scale_mlp_norm is not supported")
        if not all(type(ls) in (nn.Identity, LayerScale) for ls in (block.ls1, block.ls2)):
            raise ValueError(f"{name}: only LayerScale (or none) is supported after the sublayers")
    norms = [vit.norm_pre, vit.norm, vit.fc_norm]
    for block in blocks:
        norms += [block.norm1, block.norm2, block.attn.q_norm, block.attn.k_norm]
    eps = _norm_eps(norms, name)
    approximations = {_gelu(block.mlp.act, name) for block in blocks}
    if len(approximations) != 1:
        raise ValueError(f"{name}: the blocks mix GELU approximations {sorted(approximations)}")
    dim, hidden = vit.embed_dim, first.mlp.fc1.out_features
    mlp_ratio = hidden / dim
    if int(dim * mlp_ratio) != hidden:
        raise ValueError(f"{name}: MLP width {hidden} is not int(embed_dim * mlp_ratio) for any ratio timm rebuilds")
    if first.attn.num_heads * first.attn.head_dim != dim:
        raise ValueError(f"{name}: heads x head_dim must equal embed_dim ({dim})")
    return {
        "format": VIT_SPEC_FORMAT,
        "vit": {
            "img_size": list(patch.img_size),
            "patch_size": list(patch.patch_size),
            "in_chans": patch.proj.in_channels,
            "num_classes": vit.head.out_features,
            "global_pool": vit.global_pool,
            "embed_dim": dim,
            "depth": len(blocks),
            "num_heads": first.attn.num_heads,
            "mlp_ratio": mlp_ratio,
            "qkv_bias": first.attn.qkv.bias is not None,
            "qk_norm": not isinstance(first.attn.q_norm, nn.Identity),
            "proj_bias": first.attn.proj.bias is not None,
            "init_values": LAYER_SCALE_INIT if isinstance(first.ls1, LayerScale) else None,
            "class_token": vit.cls_token is not None,
            "pre_norm": not isinstance(vit.norm_pre, nn.Identity),
            "final_norm": not (isinstance(vit.norm, nn.Identity) and isinstance(vit.fc_norm, nn.Identity)),
            "fc_norm": not isinstance(vit.fc_norm, nn.Identity),
        },
        "layer_norm_eps": eps,
        "gelu_approximate": approximations.pop(),
    }


def vit_spec(model: ImageClassifier) -> dict[str, Any]:
    """What ``vit_from_spec`` needs besides the state dict (JSON-able): timm ``VisionTransformer`` kwargs, the
    LayerNorm epsilon, the GELU form, and the normalisation mean/std."""
    spec = _timm_layout(model.vit)
    spec["mean"] = [float(v) for v in model.mean.flatten()]
    spec["std"] = [float(v) for v in model.std.flatten()]
    return spec


def _rebuilt(spec: dict[str, Any], state: dict[str, torch.Tensor], source: str) -> ImageClassifier:
    """The canonical ViT of ``spec`` holding ``state`` (a timm ``VisionTransformer`` state dict, strict)."""
    model = vit_from_spec(spec)
    try:
        model.vit.load_state_dict(state, strict=True)
    except RuntimeError as err:
        raise ValueError(f"{source}: its weights do not fit the canonical ViT layout: {err}") from err
    return model.eval()


def _channel_values(value: float | Sequence[float], channels: int, what: str) -> list[float]:
    values = [float(value)] * channels if isinstance(value, int | float) else [float(v) for v in value]
    if len(values) != channels:
        raise ValueError(f"{what} has {len(values)} values for {channels} channels")
    return values


def processor_normalisation(config: dict[str, Any] | None, channels: int) -> tuple[list[float], list[float]]:
    """Mean/std on pixels in [0, 1] from a Hugging Face image processor config (``preprocessor_config.json``):
    ``image_mean`` / ``image_std`` (default 0.5), none with ``do_normalize`` false. A ``rescale_factor`` other than
    1/255 is folded in (the processor's raw input is taken as 255 x our pixels). Resizing stays the caller's: the
    backbone takes ``config.image_size`` images."""
    if config is None:
        return [0.5] * channels, [0.5] * channels
    if config.get("do_normalize", True):
        mean = _channel_values(config.get("image_mean", 0.5), channels, "image_mean")
        std = _channel_values(config.get("image_std", 0.5), channels, "image_std")
    else:
        mean, std = [0.0] * channels, [1.0] * channels
    scale = 255.0 * float(config.get("rescale_factor", 1 / 255)) if config.get("do_rescale", True) else 1.0
    if abs(scale - 1.0) > 1e-9:  # model input = (raw * r - m) / s with raw = 255 p: (p - m / 255r) / (s / 255r)
        mean, std = [m / scale for m in mean], [s / scale for s in std]
    return mean, std


def vit_from_hf(model: ViTForImageClassification | DeiTForImageClassification,
                image_processor_config: dict[str, Any] | None = None) -> tuple[ImageClassifier, list[str] | None]:
    """A Hugging Face ``ViTForImageClassification`` as the canonical timm ViT: class token, token pooling, qkv as HF's
    query/key/value concatenated, its LayerNorm epsilon and GELU, the position embeddings as they are (fixed image
    size ``config.image_size``), final ``layernorm`` and ``classifier`` head; mean/std from the image processor config
    (``processor_normalisation``). HF DeiT models carry a distillation token in their embeddings (even
    ``DeiTForImageClassification``), which the transition view cannot hold: refused."""
    if isinstance(model, DeiTForImageClassificationWithTeacher):
        raise ValueError("DeiTForImageClassificationWithTeacher: a distillation token and head are not supported by "
                         "the transition view (supported: ViTForImageClassification)")
    if not isinstance(model, ViTForImageClassification | DeiTForImageClassification):
        raise ValueError(f"{type(model).__name__}: supported are ViTForImageClassification (and DeiT without a "
                         "distillation token)")
    base = model.base_model
    name = type(model).__name__
    if getattr(base.embeddings, "distillation_token", None) is not None:
        raise ValueError(f"{name}: its embeddings carry a distillation token ([CLS, DIST] + patches), which the "
                         "transition view does not support (supported: ViTForImageClassification)")
    config = model.config
    if not isinstance(model.classifier, nn.Linear):
        raise ValueError(f"{name}: a classifier needs a linear head (num_labels > 0)")
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if head_dim * config.num_attention_heads != config.hidden_size:
        raise ValueError(f"{name}: heads x head_dim must equal hidden_size ({config.hidden_size})")
    mlp_ratio = config.intermediate_size / config.hidden_size
    if int(config.hidden_size * mlp_ratio) != config.intermediate_size:
        raise ValueError(f"{name}: intermediate_size {config.intermediate_size} cannot be rebuilt by timm")
    layers = list(base.layers)
    approximations = {_gelu(layer.mlp.activation_fn, name) for layer in layers}
    if len(approximations) != 1:
        raise ValueError(f"{name}: the layers mix GELU approximations {sorted(approximations)}")
    norms = [base.layernorm] + [n for layer in layers for n in (layer.layernorm_before, layer.layernorm_after)]
    patch = base.embeddings.patch_embeddings
    mean, std = processor_normalisation(image_processor_config, patch.num_channels)
    spec = {
        "format": VIT_SPEC_FORMAT,
        "vit": {
            "img_size": list(patch.image_size),
            "patch_size": list(patch.patch_size),
            "in_chans": patch.num_channels,
            "num_classes": model.classifier.out_features,
            "global_pool": "token",
            "embed_dim": config.hidden_size,
            "depth": len(layers),
            "num_heads": config.num_attention_heads,
            "mlp_ratio": mlp_ratio,
            "qkv_bias": bool(config.qkv_bias),
            "qk_norm": False,
            "proj_bias": True,
            "init_values": None,
            "class_token": True,
            "pre_norm": False,
            "final_norm": True,
            "fc_norm": False,
        },
        "layer_norm_eps": _norm_eps(norms, name),
        "gelu_approximate": approximations.pop(),
        "mean": mean,
        "std": std,
    }
    emb = base.embeddings
    state = {
        "cls_token": emb.cls_token,
        "pos_embed": emb.position_embeddings,
        "patch_embed.proj.weight": patch.projection.weight,
        "patch_embed.proj.bias": patch.projection.bias,
        "norm.weight": base.layernorm.weight,
        "norm.bias": base.layernorm.bias,
        "head.weight": model.classifier.weight,
        "head.bias": model.classifier.bias,
    }
    for i, layer in enumerate(layers):
        attn, prefix = layer.attention, f"blocks.{i}."
        state[prefix + "attn.qkv.weight"] = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])
        if config.qkv_bias:
            state[prefix + "attn.qkv.bias"] = torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias])
        pairs = {"attn.proj": attn.o_proj, "norm1": layer.layernorm_before, "norm2": layer.layernorm_after,
                 "mlp.fc1": layer.mlp.fc1, "mlp.fc2": layer.mlp.fc2}
        for target, module in pairs.items():
            state[f"{prefix}{target}.weight"] = module.weight
            state[f"{prefix}{target}.bias"] = module.bias
    state = {k: v.detach() for k, v in state.items()}
    return _rebuilt(spec, state, name), _ordered_labels(config.id2label, model.classifier.out_features)


def vit_from_timm(model: VisionTransformer, mean: Sequence[float] | None = None, std: Sequence[float] | None = None
                  ) -> tuple[ImageClassifier, list[str] | None]:
    """A timm ``VisionTransformer`` (e.g. ``timm.create_model(name, pretrained=False, num_classes=...,
    checkpoint_path=...)``) as the canonical ``ImageClassifier``: rebuilt from its spec with its weights; mean/std
    from ``model.pretrained_cfg`` when not given. Refused (ValueError naming the class): register tokens, distilled
    ViTs (``VisionTransformerDistilled``), attention pooling, dynamic image size and other non-plain layouts."""
    spec = _timm_layout(model)
    cfg = dict(getattr(model, "pretrained_cfg", None) or {})
    channels = spec["vit"]["in_chans"]
    if (mean is None and "mean" not in cfg) or (std is None and "std" not in cfg):
        raise ValueError(f"{type(model).__name__}: no pretrained_cfg mean/std; pass mean and std")
    spec["mean"] = _channel_values(cfg["mean"] if mean is None else mean, channels, "mean")
    spec["std"] = _channel_values(cfg["std"] if std is None else std, channels, "std")
    state = {k: v.detach() for k, v in model.state_dict().items()}
    names = cfg.get("label_names")
    labels = [str(n) for n in names] if names and len(names) == spec["vit"]["num_classes"] else None
    return _rebuilt(spec, state, type(model).__name__), labels


# ----------------------------------------------------------------------------------------------------- text


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
    wanted = _gelu(source_act, f"{where} ({config.hidden_act!r}; the scriptable text layers)")
    if _gelu(target.encoder.layer[0].intermediate.intermediate_act_fn, where) != wanted:
        raise ValueError(f"{where}: activation {config.hidden_act!r} does not rebuild as the same GELU")
    return target


def _hf_head(model: PreTrainedModel, family: str) -> ClassifierHead:
    """The sequence-classification head as a ``ClassifierHead`` (copied weights)."""
    if family == "bert":
        pooler = model.bert.pooler
        if pooler is None:
            raise ValueError("BertForSequenceClassification without its pooler is not supported")
        return ClassifierHead(_copy_linear(model.classifier), _copy_linear(pooler.dense), "tanh")
    if family == "roberta":
        return ClassifierHead(_copy_linear(model.classifier.out_proj), _copy_linear(model.classifier.dense), "tanh")
    if family == "electra":
        head = model.classifier
        if _gelu(head.activation, type(model).__name__) != "none":
            raise ValueError(f"{type(model).__name__}: the head's GELU must be exact")
        return ClassifierHead(_copy_linear(head.out_proj), _copy_linear(head.dense), "gelu")
    return ClassifierHead(_copy_linear(model.classifier), _copy_linear(model.pre_classifier), "relu")


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
        return classifier.eval(), _ordered_labels(model.config.id2label, labels)
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
