"""The decoder family (Qwen2 / Llama-style: pre-RMSNorm, rotary positions, grouped-query attention, SwiGLU, causal
mask; texts): a Hugging Face ``*ForSequenceClassification`` kept as it is for the head fit and the backbone's logits,
re-read as transitions by ``models.decoder_view`` and exported as the text artifact on the plain modules of
``models.decoder_layers`` (``models.decoder_director``).
Its kernel attends causally, like the layers it imitates."""

from __future__ import annotations

from typing import Any

import torch
import transformers
from torch import nn

from models.decoder_director import decoder_director_from_view
from models.decoder_view import DecoderTransitionView
from models.kernel import TransitionKernel
from models.text_director import TextDirector
from training.config import PipelineConfig
from training.families.base import View
from training.families.bert import TextFamily

ARCHITECTURES = ("Qwen2ForSequenceClassification", "LlamaForSequenceClassification")


class DecoderClassifier(nn.Module):
    """(input_ids, attention_mask) [B, L] -> logits [B, C]: the checkpoint's own forward, pooling on the last real
    token of right-padded inputs (as ``*ForSequenceClassification`` does)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    @property
    def num_classes(self) -> int:
        return int(self.model.score.out_features)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask).logits  # [B, C]


def decoder_spec(model: nn.Module) -> dict[str, Any]:
    """What ``decoder_from_spec`` needs to rebuild the checkpoint's module layout (weights come separately)."""
    return {"architecture": type(model).__name__, "config": model.config.to_dict()}


def decoder_from_spec(spec: dict[str, Any]) -> DecoderClassifier:
    if spec["architecture"] not in ARCHITECTURES:
        raise ValueError(f"unknown decoder architecture {spec['architecture']!r}; expected one of {ARCHITECTURES}")
    cls = getattr(transformers, spec["architecture"])
    config = cls.config_class.from_dict(spec["config"])
    config._attn_implementation = "eager"
    return DecoderClassifier(cls(config))


class DecoderFamily(TextFamily):
    name = "decoder"
    causal = True

    def build_backbone(self, payload: dict[str, Any]) -> DecoderClassifier:
        model = decoder_from_spec(payload["spec"])
        model.load_state_dict(payload["state_dict"])
        return model

    def head(self, backbone: nn.Module) -> nn.Module:
        return backbone.model.score

    def view(self, backbone: nn.Module) -> DecoderTransitionView:
        assert isinstance(backbone, DecoderClassifier)
        return DecoderTransitionView(backbone.model)

    def default_readout(self, view: View) -> nn.Module:
        return view.readout_head  # already a plain, scriptable module

    def director(self, view: View, kernel: TransitionKernel, readout: nn.Module | None = None) -> TextDirector:
        assert isinstance(view, DecoderTransitionView)
        return decoder_director_from_view(view, kernel, readout)

    def describe(self, backbone: nn.Module, cfg: PipelineConfig) -> dict[str, Any]:
        config = backbone.model.config
        return {"kind": f"pretrained {cfg.pretrained.source} ({type(backbone.model).__name__})",
                "hidden_size": config.hidden_size, "layers": config.num_hidden_layers,
                "heads": config.num_attention_heads, "key_value_heads": config.num_key_value_heads,
                "intermediate_size": config.intermediate_size, "vocab_size": config.vocab_size,
                "pooling": "last real token", "tokenizer": cfg.text.tokenizer}

    def text_positions(self, config: Any) -> int | None:
        return None  # rotary positions: no table to outgrow

    def encoder_with_fresh_head(self, source: str, load_args: dict[str, Any], num_classes: int, pooling: str
                                ) -> tuple[nn.Module, dict[str, Any]] | None:
        return None  # *ForSequenceClassification's fresh score head, on the last real token

    def from_hf(self, model: nn.Module, processor: dict[str, Any] | None, pad_id: int | None
                ) -> tuple[nn.Module, dict[str, Any]]:
        if pad_id is not None:
            model.config.pad_token_id = pad_id  # *ForSequenceClassification finds the last real token by it
        model.float()
        return DecoderClassifier(model), decoder_spec(model)
