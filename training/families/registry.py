"""The supported families and how one is found: from a run's ``backbone.pt`` payload, from a config's modality (the
pipeline's own backbones), or from a Hugging Face checkpoint's ``model_type`` (``family_for_model_type``)."""

from __future__ import annotations

from typing import Any

from training.families.base import Family
from training.families.bert import BertFamily
from training.families.decoder import DecoderFamily
from training.families.vit import VitFamily

FAMILIES: dict[str, Family] = {"vit": VitFamily(), "bert": BertFamily(), "decoder": DecoderFamily()}
# the Hugging Face ``model_type`` values each family reads (their checkpoints convert exactly; docs/your-own-model.md)
MODEL_TYPES: dict[str, tuple[str, ...]] = {
    "vit": ("vit", "deit"),
    "bert": ("bert", "roberta", "xlm-roberta", "camembert", "distilbert", "electra"),
    "decoder": ("qwen2", "llama"),
}
OWN_BACKBONES = {"image": "vit", "text": "bert"}  # what the pipeline fits itself for each modality


class UnsupportedBackbone(ValueError):
    """A checkpoint no family reads; the message names its model type and the supported ones."""


def family_of(name: str) -> Family:
    return FAMILIES[name]


def modality_family(modality: str) -> Family:
    """The family of the pipeline's own backbone for a modality; what loads a config's data (every family of a
    modality reads data alike)."""
    return FAMILIES[OWN_BACKBONES[modality]]


def payload_family(payload: dict[str, Any]) -> Family:
    """The family of a ``backbone.pt`` payload (older payloads name only their modality)."""
    if "family" in payload:
        return FAMILIES[payload["family"]]
    return FAMILIES[OWN_BACKBONES[payload.get("modality", "image")]]


def supported_model_types() -> str:
    return "; ".join(f"{name}: {', '.join(types)}" for name, types in MODEL_TYPES.items())


def family_for_model_type(model_type: str, where: str) -> Family:
    """The family that reads a Hugging Face ``model_type``, or ``UnsupportedBackbone`` naming what is supported."""
    for name, types in MODEL_TYPES.items():
        if model_type in types:
            return FAMILIES[name]
    raise UnsupportedBackbone(f"{where}: model_type {model_type!r} is not supported. Supported families and model "
                              f"types: {supported_model_types()}; timm ViT/DeiT models as timm:<model name>")
