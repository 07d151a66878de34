"""A user's pretrained checkpoint: which family reads it, whether it carries a classification head, its class names,
its input (image size, or tokenizer and pad token), and the checkpoint loaded and converted for its family.

Sources: a Hugging Face checkpoint folder (``save_pretrained`` layout: ``config.json`` + safetensors) or hub id (with
internet), or ``timm:<model name>`` with a weights file. Inspection reads the configuration only (a dry run loads
no weights). A folder is read offline; only a source that is no local path goes to the hub.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer
from torch import nn

from artifact.tokenizer import tokenizer_problem
from training.families.base import Family
from training.families.registry import UnsupportedBackbone, family_for_model_type, family_of

TIMM_PREFIX = "timm:"
HEAD_SUFFIXES = ("ForSequenceClassification", "ForImageClassification", "ForImageClassificationWithTeacher")
TIMM_VITS = ("VisionTransformer", "VisionTransformerDistilled")
GENERIC_LABEL = re.compile(r"^LABEL_\d+$")  # transformers' default id2label names no class


class CheckpointError(ValueError):
    """A checkpoint that cannot be read as asked; the message says what to change."""


@dataclass
class Checkpoint:
    """What a checkpoint is, read from its configuration."""

    source: str
    weights: str | None  # a timm weights file
    family: Family
    model_type: str
    architecture: str
    has_head: bool
    num_classes: int | None  # the head's classes (None: no head)
    labels: list[str] | None  # the head's class names in index order (None: none, or transformers' LABEL_i)
    layers: int
    hidden_size: int
    heads: int
    image_shape: tuple[int, int, int] | None = None  # images: (channels, height, width)
    max_positions: int | None = None  # texts with absolute positions: the longest input
    config: dict[str, Any] = field(default_factory=dict)  # config.json, or timm's pretrained configuration
    hf_config: Any = None  # the transformers configuration object (None for timm)
    model_args: dict[str, Any] = field(default_factory=dict)  # timm.create_model's keyword arguments

    @property
    def multi_label(self) -> bool:
        """A Hugging Face head trained with a sigmoid per label (``problem_type: multi_label_classification``)."""
        return self.config.get("problem_type") == "multi_label_classification"

    @property
    def local(self) -> bool:
        return Path(self.source).exists()


def _hf_config(source: str) -> Any:
    from transformers import AutoConfig

    local = Path(source).exists()
    if local and not (Path(source) / "config.json").is_file():
        raise CheckpointError(f"{source}: no config.json; expected a Hugging Face save_pretrained folder")
    if local:
        refuse_custom_code(source, json.loads((Path(source) / "config.json").read_text(encoding="utf-8")))
    try:
        config = AutoConfig.from_pretrained(source, local_files_only=local, trust_remote_code=False)
    except (OSError, ValueError) as err:
        where = "folder" if local else "hub id (needs internet)"
        raise CheckpointError(f"{source}: cannot read its configuration as a {where}: {err}") from err
    refuse_custom_code(source, config.to_dict())
    return config


def refuse_custom_code(source: str, config: dict[str, Any]) -> None:
    """A checkpoint whose configuration names its own Python classes (``auto_map``) would need its code run to load;
    nothing a checkpoint ships is ever run here (docs/operations.md, "Threat model")."""
    if config.get("auto_map"):
        raise CheckpointError(f"{source}: its config.json names its own Python code (auto_map: "
                              f"{sorted(config['auto_map'])[:3]}); checkpoints that need their own code are refused, "
                              "never run. Use a checkpoint of a supported family whose classes transformers ships")


def weights_format(checkpoint: Checkpoint) -> dict[str, Any]:
    """``from_pretrained``'s arguments that keep a checkpoint's code from running: never its own classes, and its
    safetensors weights wherever the folder has them (a ``.bin`` file is a pickle)."""
    folder = Path(checkpoint.source)
    safetensors = checkpoint.local and any(folder.glob("*.safetensors"))
    return {"local_files_only": checkpoint.local, "trust_remote_code": False,
            **({"use_safetensors": True} if safetensors else {})}


def _labels(id2label: dict[Any, str] | None, num_classes: int) -> list[str] | None:
    if not id2label or len(id2label) != num_classes:
        return None
    names = [str(id2label[i] if i in id2label else id2label[str(i)]) for i in range(num_classes)]
    return None if all(GENERIC_LABEL.match(n) for n in names) else names


def inspect_checkpoint(source: str, weights: str | None = None, model_args: dict[str, Any] | None = None
                       ) -> Checkpoint:
    """The checkpoint's family and shape, or ``UnsupportedBackbone`` / ``CheckpointError`` saying why not.
    ``model_args``: keyword arguments of ``timm.create_model`` (a timm architecture with other sizes)."""
    if source.startswith(TIMM_PREFIX):
        return _inspect_timm(source.removeprefix(TIMM_PREFIX), weights, model_args or {})
    config = _hf_config(source)
    model_type = str(getattr(config, "model_type", ""))
    family = family_for_model_type(model_type, source)
    architectures = list(getattr(config, "architectures", None) or [])
    architecture = architectures[0] if architectures else type(config).__name__.removesuffix("Config") + "Model"
    has_head = any(a.endswith(HEAD_SUFFIXES) for a in architectures)
    num_classes = int(config.num_labels) if has_head else None
    image_shape = None
    if family.modality == "image":
        size = config.image_size
        image_shape = (int(config.num_channels), *(size if isinstance(size, list | tuple) else (size, size)))
    max_positions = family.text_positions(config)
    return Checkpoint(
        source=source, weights=None, family=family, model_type=model_type, architecture=architecture,
        has_head=has_head, num_classes=num_classes,
        labels=_labels(config.id2label, num_classes) if has_head and num_classes else None,
        layers=int(getattr(config, "num_hidden_layers", getattr(config, "n_layers", 0))),
        hidden_size=int(getattr(config, "hidden_size", getattr(config, "dim", 0))),
        heads=int(getattr(config, "num_attention_heads", getattr(config, "n_heads", 0))),
        image_shape=image_shape, max_positions=max_positions, config=config.to_dict(), hf_config=config)


def _timm_state(weights: str) -> dict[str, torch.Tensor]:
    path = Path(weights)
    if not path.is_file():
        raise CheckpointError(f"timm weights file {weights} not found")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    state = torch.load(path, map_location="cpu", weights_only=True)
    for key in ("state_dict", "model", "state_dict_ema"):  # training scripts' wrappers
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    return state


def _create_timm(name: str, num_classes: int, model_args: dict[str, Any]) -> nn.Module:
    import timm

    try:
        return timm.create_model(name, pretrained=False, num_classes=num_classes, **model_args)
    except TypeError as err:
        raise CheckpointError(f"timm:{name} does not take the model arguments {model_args}: {err}") from err


def _inspect_timm(name: str, weights: str | None, model_args: dict[str, Any]) -> Checkpoint:
    import timm

    if weights is None:
        raise CheckpointError(f"timm:{name} needs its weights file: --checkpoint PATH (.safetensors or .pth)")
    if not timm.is_model(name):
        raise UnsupportedBackbone(f"timm:{name} is not a timm model name")
    state = _timm_state(weights)
    head = state.get("head.weight")
    model = _create_timm(name, 0 if head is None else int(head.shape[0]), model_args)
    if type(model).__name__ not in TIMM_VITS:
        raise UnsupportedBackbone(f"timm:{name} is a {type(model).__name__}; supported: timm VisionTransformer and "
                                  "VisionTransformerDistilled (ViT, DeiT)")
    cfg = dict(model.pretrained_cfg or {})
    height, width = model.patch_embed.img_size  # the built model's, which model_args may change
    channels = int(model.patch_embed.proj.in_channels)
    return Checkpoint(
        source=f"{TIMM_PREFIX}{name}", weights=weights, family=family_of("vit"), model_type="timm", architecture=name,
        has_head=head is not None, num_classes=None if head is None else int(head.shape[0]), labels=None,
        layers=len(model.blocks), hidden_size=int(model.embed_dim), heads=int(model.blocks[0].attn.num_heads),
        image_shape=(int(channels), int(height), int(width)), config=cfg, model_args=model_args)


def load_classifier(checkpoint: Checkpoint, num_classes: int, pad_id: int | None = None, pooling: str = "cls"
                    ) -> tuple[nn.Module, dict[str, Any]]:
    """The checkpoint as its family's classifier with ``num_classes`` outputs (a fresh head when it has none) and the
    spec that rebuilds it (``build_backbone``'s payload, weights aside). ``pad_id``: a decoder's padding token;
    ``pooling``: how a fresh encoder head pools (``cls`` | ``mean``; a checkpoint's own head keeps its [CLS])."""
    if checkpoint.has_head and checkpoint.num_classes != num_classes:
        raise CheckpointError(f"{checkpoint.source}: its head has {checkpoint.num_classes} classes, the data "
                              f"{num_classes}; give data with the head's classes (or a checkpoint without a head)")
    if checkpoint.model_type == "timm":
        return _timm_classifier(checkpoint, num_classes)
    from transformers import AutoModelForImageClassification, AutoModelForSequenceClassification

    family = checkpoint.family
    fresh = None if checkpoint.has_head else family.encoder_with_fresh_head(
        checkpoint.source, weights_format(checkpoint), num_classes, pooling)
    if fresh is not None:
        return fresh
    auto = AutoModelForImageClassification if checkpoint.family.modality == "image" else \
        AutoModelForSequenceClassification
    if checkpoint.architecture.endswith("WithTeacher"):  # DeiT's two heads, which the Auto class would drop
        import transformers

        auto = getattr(transformers, checkpoint.architecture)
    model = auto.from_pretrained(checkpoint.source, num_labels=num_classes, **weights_format(checkpoint),
                                 attn_implementation="eager").eval()
    return family.from_hf(model, _processor_config(checkpoint) if family.modality == "image" else None, pad_id)


def _processor_config(checkpoint: Checkpoint) -> dict[str, Any] | None:
    """The image processor's configuration (mean, std, rescale factor) of a checkpoint folder or hub id."""
    if checkpoint.local:
        path = Path(checkpoint.source) / "preprocessor_config.json"
        return json.loads(path.read_text()) if path.is_file() else None
    from transformers import AutoImageProcessor

    return AutoImageProcessor.from_pretrained(checkpoint.source, trust_remote_code=False).to_dict()


def _timm_classifier(checkpoint: Checkpoint, num_classes: int) -> tuple[nn.Module, dict[str, Any]]:
    from models.checkpoints import vit_from_timm, vit_spec

    state = _timm_state(checkpoint.weights or "")
    model = _create_timm(checkpoint.architecture, num_classes, checkpoint.model_args)
    heads = {"head.weight", "head.bias", "head_dist.weight", "head_dist.bias"}
    if not checkpoint.has_head:
        state = {k: v for k, v in state.items() if k not in heads}
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as err:  # shapes that differ
        raise CheckpointError(f"{checkpoint.weights}: the weights do not fit timm:{checkpoint.architecture} "
                              f"{checkpoint.model_args or ''} ({str(err).splitlines()[1].strip()[:200]})") from err
    if unexpected or set(missing) - (heads if not checkpoint.has_head else set()):
        raise CheckpointError(f"{checkpoint.weights}: the weights do not fit timm:{checkpoint.architecture} "
                              f"(missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]})")
    classifier, _ = vit_from_timm(model.eval())
    return classifier, vit_spec(classifier)


def refuse_empty_vocabulary(checkpoint: Checkpoint, wrapper: Any) -> None:
    """A tokenizer whose vocabulary is its special tokens alone is what transformers builds for a folder without
    tokenizer files: it reads every text as those tokens, so every input would look the same to the model."""
    special = set(wrapper.all_special_ids)
    if not set(wrapper.get_vocab().values()) <= special:
        return
    files = list(dict.fromkeys(wrapper.vocab_files_names.values()))
    missing = [name for name in files if not (Path(checkpoint.source) / name).exists()] if checkpoint.local else files
    raise CheckpointError(
        f"{checkpoint.source}: no tokenizer files ({', '.join(missing)} missing), so the tokenizer transformers "
        f"builds for it holds only {' '.join(wrapper.all_special_tokens)} and reads every text as those alone; add "
        "the tokenizer the model was trained with (its tokenizer.save_pretrained(FOLDER) writes tokenizer.json and "
        "tokenizer_config.json)")


def refuse_unservable(checkpoint: Checkpoint, tokenizer: Tokenizer, max_length: int) -> None:
    """The server's own check of a version's tokenizer (``artifact.tokenizer``), run on this one as the server will
    read it (truncating, not padding), so a version it would refuse is refused before anything is trained."""
    served = Tokenizer.from_str(tokenizer.to_str())
    served.no_padding()
    problem = tokenizer_problem(served, max_length, int(tokenizer.padding["pad_id"]))
    if problem is not None:
        raise CheckpointError(f"{checkpoint.source}: the server would refuse to load the model: {problem}; use the "
                              "tokenizer the model was trained with, or another --set text.max_length")


def checkpoint_tokenizer(checkpoint: Checkpoint, max_length: int) -> Tokenizer:
    """The checkpoint's own tokenizer, truncating at ``max_length`` tokens and recording its padding token (right
    padding: every text starts at position 0), as the run's and the artifact's ``tokenizer.json``; refused when it
    reads nothing but special tokens or when the server would refuse it."""
    from transformers import AutoTokenizer

    try:
        wrapper = AutoTokenizer.from_pretrained(checkpoint.source, local_files_only=checkpoint.local,
                                                trust_remote_code=False)
    except (OSError, ValueError) as err:
        raise CheckpointError(f"{checkpoint.source}: cannot load its tokenizer: {err}") from err
    if not getattr(wrapper, "is_fast", False):
        raise CheckpointError(f"{checkpoint.source}: its tokenizer has no fast (tokenizer.json) form; the artifact "
                              "ships tokenizer.json")
    refuse_empty_vocabulary(checkpoint, wrapper)
    pad_token = wrapper.pad_token or wrapper.eos_token
    if pad_token is None:
        raise CheckpointError(f"{checkpoint.source}: its tokenizer names no pad or end-of-text token; add a "
                              "pad_token to its tokenizer_config.json")
    tokenizer = Tokenizer.from_str(wrapper.backend_tokenizer.to_str())
    pad = tokenizer.token_to_id(pad_token)
    if pad is None:
        raise CheckpointError(f"{checkpoint.source}: pad token {pad_token!r} is not in its vocabulary")
    tokenizer.enable_truncation(max_length, strategy="longest_first", direction="right")
    tokenizer.enable_padding(direction="right", pad_id=pad, pad_token=pad_token)
    refuse_unservable(checkpoint, tokenizer, max_length)
    return tokenizer


def parameter_count(checkpoint: Checkpoint) -> int:
    """The checkpoint's parameters, counted on a weightless copy (the meta device: nothing is allocated or read)."""
    with torch.device("meta"):
        if checkpoint.model_type == "timm":
            model = _create_timm(checkpoint.architecture, checkpoint.num_classes or 0, checkpoint.model_args)
        else:
            from transformers import AutoModel

            model = AutoModel.from_config(checkpoint.hf_config)
    return sum(p.numel() for p in model.parameters())
