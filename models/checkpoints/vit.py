"""Vision converters: a Hugging Face ViT / DeiT classifier or a timm ``VisionTransformer`` (or DeiT's
``VisionTransformerDistilled``) as the canonical timm ViT inside ``ImageClassifier`` (view: ``VitTransitionView``),
and the spec that rebuilds it."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

import torch
from timm.layers import Attention, LayerScale, Mlp, PatchEmbed
from timm.models.deit import VisionTransformerDistilled
from timm.models.vision_transformer import Block, VisionTransformer
from torch import nn
from transformers import DeiTForImageClassification, DeiTForImageClassificationWithTeacher, ViTForImageClassification

from models.backbones import ImageClassifier
from models.checkpoints.common import checked_gelu, ordered_labels

VIT_SPEC_FORMAT = "director.vit/1"
LAYER_SCALE_INIT = 1e-5  # any value: the LayerScale gains are weights, loaded with the state dict


def vit_from_spec(spec: dict[str, Any]) -> ImageClassifier:
    """A randomly initialised ``ImageClassifier`` with the layout ``vit_spec`` recorded (eval mode): load the saved
    state dict into it."""
    if spec.get("format") != VIT_SPEC_FORMAT:
        raise ValueError(f"not a ViT spec (format {spec.get('format')!r}, expected {VIT_SPEC_FORMAT!r})")
    kwargs = dict(spec["vit"])
    for key in ("img_size", "patch_size"):
        kwargs[key] = tuple(kwargs[key])
    architecture = VisionTransformerDistilled if spec.get("distilled") else VisionTransformer
    vit = architecture(**kwargs, norm_layer=partial(nn.LayerNorm, eps=float(spec["layer_norm_eps"])),
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


def _check_timm_model(vit: VisionTransformer, name: str) -> None:
    """Refuses a timm ViT whose class, embedding, pooling, patch stem or head the transition view cannot take."""
    if type(vit) not in (VisionTransformer, VisionTransformerDistilled):
        raise ValueError(f"{name}: supported are timm's plain VisionTransformer (class, register tokens) and "
                         "VisionTransformerDistilled (DeiT's distillation token and head)")
    if vit.dynamic_img_size or vit.pos_embed is None:
        raise ValueError(f"{name}: the transition view needs a fixed image size and learned position embeddings "
                         "(dynamic_img_size and pos_embed='none' are not supported)")
    if type(vit) is VisionTransformerDistilled and (vit.reg_token is not None or vit.no_embed_class):
        raise ValueError(f"{name}: a distilled ViT with register tokens or no_embed_class is not supported")
    if vit.attn_pool is not None or vit.global_pool not in ("avg", "token") or vit.pool_include_prefix:
        raise ValueError(f"{name}: only 'token' or 'avg' pooling (without prefix tokens) is supported, got "
                         f"{vit.global_pool!r}")
    patch = vit.patch_embed
    if (type(patch) is not PatchEmbed or not isinstance(patch.norm, nn.Identity) or not patch.flatten
            or patch.dynamic_img_pad):
        raise ValueError(f"{name}: only a plain PatchEmbed (no norm, no hybrid stem, no dynamic padding) is supported")
    if not isinstance(vit.head, nn.Linear) or not isinstance(getattr(vit, "head_dist", vit.head), nn.Linear):
        raise ValueError(f"{name}: a classifier needs a linear head (num_classes > 0)")


def _check_timm_blocks(blocks: Sequence[nn.Module], name: str) -> None:
    """Refuses blocks other than timm's plain Block / Attention / Mlp (with LayerScale or none)."""
    for block in blocks:
        if type(block) is not Block or type(block.attn) is not Attention or type(block.mlp) is not Mlp:
            raise ValueError(f"{name}: only timm Block / Attention / Mlp layers are supported")
        if not isinstance(block.attn.norm, nn.Identity) or block.attn.gate is not None:
            raise ValueError(f"{name}: attention with scale_norm or a gate is not supported")
        if not isinstance(block.mlp.norm, nn.Identity):
            raise ValueError(f"{name}: an MLP with scale_mlp_norm is not supported")
        if not all(type(ls) in (nn.Identity, LayerScale) for ls in (block.ls1, block.ls2)):
            raise ValueError(f"{name}: only LayerScale (or none) is supported after the sublayers")


def _timm_widths(vit: VisionTransformer, first: Block, name: str) -> float:
    """The MLP ratio of a timm ViT, refused when timm cannot rebuild its MLP width or its heads do not fill it."""
    dim, hidden = vit.embed_dim, first.mlp.fc1.out_features
    mlp_ratio = hidden / dim
    if int(dim * mlp_ratio) != hidden:
        raise ValueError(f"{name}: MLP width {hidden} is not int(embed_dim * mlp_ratio) for any ratio timm rebuilds")
    if first.attn.num_heads * first.attn.head_dim != dim:
        raise ValueError(f"{name}: heads x head_dim must equal embed_dim ({dim})")
    return mlp_ratio


def _timm_layout(vit: VisionTransformer) -> dict[str, Any]:
    """The ``vit_spec`` fields of a timm ViT (all but mean/std); refuses what ``VitTransitionView`` cannot take or
    ``VisionTransformer(**kwargs)`` cannot rebuild."""
    name = type(vit).__name__
    _check_timm_model(vit, name)
    blocks = list(vit.blocks)
    _check_timm_blocks(blocks, name)
    first: Block = blocks[0]
    norms = [vit.norm_pre, vit.norm, vit.fc_norm]
    for block in blocks:
        norms += [block.norm1, block.norm2, block.attn.q_norm, block.attn.k_norm]
    eps = _norm_eps(norms, name)
    approximations = {checked_gelu(block.mlp.act, name) for block in blocks}
    if len(approximations) != 1:
        raise ValueError(f"{name}: the blocks mix GELU approximations {sorted(approximations)}")
    mlp_ratio = _timm_widths(vit, first, name)
    patch = vit.patch_embed
    return {
        "format": VIT_SPEC_FORMAT,
        "vit": {
            "img_size": list(patch.img_size),
            "patch_size": list(patch.patch_size),
            "in_chans": patch.proj.in_channels,
            "num_classes": vit.head.out_features,
            "global_pool": vit.global_pool,
            "embed_dim": vit.embed_dim,
            "depth": len(blocks),
            "num_heads": first.attn.num_heads,
            "mlp_ratio": mlp_ratio,
            "qkv_bias": first.attn.qkv.bias is not None,
            "qk_norm": not isinstance(first.attn.q_norm, nn.Identity),
            "proj_bias": first.attn.proj.bias is not None,
            "init_values": LAYER_SCALE_INIT if isinstance(first.ls1, LayerScale) else None,
            "class_token": vit.cls_token is not None,
            "reg_tokens": vit.num_reg_tokens,
            "no_embed_class": vit.no_embed_class,
            "pre_norm": not isinstance(vit.norm_pre, nn.Identity),
            "final_norm": not (isinstance(vit.norm, nn.Identity) and isinstance(vit.fc_norm, nn.Identity)),
            "fc_norm": not isinstance(vit.fc_norm, nn.Identity),
        },
        "layer_norm_eps": eps,
        "gelu_approximate": approximations.pop(),
        "distilled": type(vit) is VisionTransformerDistilled,
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


HfVit = ViTForImageClassification | DeiTForImageClassification | DeiTForImageClassificationWithTeacher


def _hf_head(model: HfVit) -> nn.Module:
    """The head the canonical ViT's ``head`` copies: DeiT-with-teacher's class head, else the classifier."""
    return model.cls_classifier if isinstance(model, DeiTForImageClassificationWithTeacher) else model.classifier


def _hf_spec(model: HfVit, image_processor_config: dict[str, Any] | None) -> dict[str, Any]:
    """The ``vit_spec`` of a Hugging Face ViT / DeiT classifier; refuses what timm's ViT cannot rebuild."""
    base, name, config, head = model.base_model, type(model).__name__, model.config, _hf_head(model)
    with_teacher = isinstance(model, DeiTForImageClassificationWithTeacher)
    if not isinstance(head, nn.Linear):
        raise ValueError(f"{name}: a classifier needs a linear head (num_labels > 0)")
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if head_dim * config.num_attention_heads != config.hidden_size:
        raise ValueError(f"{name}: heads x head_dim must equal hidden_size ({config.hidden_size})")
    mlp_ratio = config.intermediate_size / config.hidden_size
    if int(config.hidden_size * mlp_ratio) != config.intermediate_size:
        raise ValueError(f"{name}: intermediate_size {config.intermediate_size} cannot be rebuilt by timm")
    layers = list(base.layers)
    approximations = {checked_gelu(layer.mlp.activation_fn, name) for layer in layers}
    if len(approximations) != 1:
        raise ValueError(f"{name}: the layers mix GELU approximations {sorted(approximations)}")
    norms = [base.layernorm] + [n for layer in layers for n in (layer.layernorm_before, layer.layernorm_after)]
    patch = base.embeddings.patch_embeddings
    mean, std = processor_normalisation(image_processor_config, patch.num_channels)
    distillation_token = getattr(base.embeddings, "distillation_token", None)
    return {
        "format": VIT_SPEC_FORMAT,
        "vit": {
            "img_size": list(patch.image_size),
            "patch_size": list(patch.patch_size),
            "in_chans": patch.num_channels,
            "num_classes": head.out_features,
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
            "reg_tokens": int(distillation_token is not None and not with_teacher),
            "no_embed_class": False,
            "pre_norm": False,
            "final_norm": True,
            "fc_norm": False,
        },
        "layer_norm_eps": _norm_eps(norms, name),
        "gelu_approximate": approximations.pop(),
        "distilled": with_teacher,
        "mean": mean,
        "std": std,
    }


def _hf_state(model: HfVit) -> dict[str, torch.Tensor]:
    """The Hugging Face weights under timm ``VisionTransformer`` names: qkv as query/key/value concatenated, DeiT's
    distillation token as ``dist_token`` (with its head) or as the one register token."""
    base, head = model.base_model, _hf_head(model)
    emb, patch = base.embeddings, base.embeddings.patch_embeddings
    distillation_token = getattr(emb, "distillation_token", None)
    state = {
        "cls_token": emb.cls_token,
        "pos_embed": emb.position_embeddings,
        "patch_embed.proj.weight": patch.projection.weight,
        "patch_embed.proj.bias": patch.projection.bias,
        "norm.weight": base.layernorm.weight,
        "norm.bias": base.layernorm.bias,
        "head.weight": head.weight,
        "head.bias": head.bias,
    }
    if isinstance(model, DeiTForImageClassificationWithTeacher):
        state |= {"dist_token": distillation_token, "head_dist.weight": model.distillation_classifier.weight,
                  "head_dist.bias": model.distillation_classifier.bias}
    elif distillation_token is not None:
        state["reg_token"] = distillation_token
    for i, layer in enumerate(base.layers):
        attn, prefix = layer.attention, f"blocks.{i}."
        state[prefix + "attn.qkv.weight"] = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])
        if model.config.qkv_bias:
            state[prefix + "attn.qkv.bias"] = torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias])
        pairs = {"attn.proj": attn.o_proj, "norm1": layer.layernorm_before, "norm2": layer.layernorm_after,
                 "mlp.fc1": layer.mlp.fc1, "mlp.fc2": layer.mlp.fc2}
        for target, module in pairs.items():
            state[f"{prefix}{target}.weight"] = module.weight
            state[f"{prefix}{target}.bias"] = module.bias
    return {k: v.detach() for k, v in state.items()}


def vit_from_hf(model: HfVit, image_processor_config: dict[str, Any] | None = None
                ) -> tuple[ImageClassifier, list[str] | None]:
    """A Hugging Face ViT or DeiT classifier as the canonical timm ViT: class token, token pooling, qkv as HF's
    query/key/value concatenated, its LayerNorm epsilon and GELU, the position embeddings as they are (fixed image
    size ``config.image_size``), final ``layernorm`` and head; mean/std from the image processor config
    (``processor_normalisation``).

    DeiT's embeddings carry a distillation token after the class token, inside the position embedding.
    ``DeiTForImageClassification`` reads only the class token: timm's ``VisionTransformer`` with that token as its
    one register token computes the same. ``DeiTForImageClassificationWithTeacher`` averages its class and
    distillation heads: timm's ``VisionTransformerDistilled``."""
    if not isinstance(model, ViTForImageClassification | DeiTForImageClassification
                      | DeiTForImageClassificationWithTeacher):
        raise ValueError(f"{type(model).__name__}: supported are ViTForImageClassification, "
                         "DeiTForImageClassification and DeiTForImageClassificationWithTeacher")
    spec = _hf_spec(model, image_processor_config)
    classifier = _rebuilt(spec, _hf_state(model), type(model).__name__)
    return classifier, ordered_labels(model.config.id2label, spec["vit"]["num_classes"])


def vit_from_timm(model: VisionTransformer, mean: Sequence[float] | None = None, std: Sequence[float] | None = None
                  ) -> tuple[ImageClassifier, list[str] | None]:
    """A timm ``VisionTransformer`` (e.g. ``timm.create_model(name, pretrained=False, num_classes=...,
    checkpoint_path=...)``) as the canonical ``ImageClassifier``: rebuilt from its spec with its weights; mean/std
    from ``model.pretrained_cfg`` when not given; register tokens and DeiT's ``VisionTransformerDistilled`` included.
    Refused (ValueError naming the class): attention pooling, dynamic image size and other non-plain layouts."""
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
