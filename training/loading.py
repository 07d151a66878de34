"""What the stages load: the run's fitted backbone, its data, the frozen transition view of the backbone and the
distilled DIRECTOR module. Stages import these from here, never from each other."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch

from models.backbones import ImageClassifier
from models.bert_view import BertTransitionView
from models.director import ImageDirector, StochasticRollout
from models.kernel import TransitionKernel
from models.text_backbones import TextClassifier
from models.text_director import TextDirector, TextReadout, text_director_from_view
from models.vit_view import VitTransitionView
from training.config import PipelineConfig
from training.data import Dataset, Split
from training.modality import modality_of
from training.predict import sampled_logits
from training.runtime import load_checkpoint
from training.text_inputs import (
    TokenDataset,
    TokenSplit,
    text_sampled_logits,
)

BACKBONE_FILE = "backbone.pt"
DIRECTOR_FILE = "director.pt"
View = VitTransitionView | BertTransitionView
Director = ImageDirector | TextDirector
AnySplit = Split | TokenSplit


def load_backbone(run_dir: str | Path, device: torch.device | str = "cpu") -> ImageClassifier | TextClassifier:
    """The fitted backbone of a run, frozen in eval mode."""
    payload = load_checkpoint(Path(run_dir) / BACKBONE_FILE)
    model = modality_of(payload.get("modality", "image")).build_backbone(payload)
    return model.to(device).eval().requires_grad_(False)


def load_data(cfg: PipelineConfig) -> Dataset | TokenDataset:
    """The run's dataset: images, or texts tokenised with the run's own tokenizer (written by fit-backbone)."""
    return modality_of(cfg.modality).load_data(cfg)


def load_view(run_dir: str | Path, device: torch.device | str = "cpu") -> View:
    """The frozen transition view of a run's fitted backbone (eval mode)."""
    backbone = load_backbone(run_dir, device)
    return BertTransitionView(backbone) if isinstance(backbone, TextClassifier) else VitTransitionView(backbone)


def default_readout(view: View) -> torch.nn.Module:
    """The readout the kernel is trained with: the view's own (image) or its plain-module copy (text)."""
    return TextReadout.from_bert(view.readout_head) if isinstance(view, BertTransitionView) else view.readout_head


def director_from_parts(view: View, kernel: TransitionKernel, readout: torch.nn.Module | None = None) -> Director:
    """DIRECTOR on the view's embedding, its first T - K transitions as the deterministic prefix (K = the kernel's
    steps), the kernel and the readout."""
    if isinstance(view, BertTransitionView):
        assert readout is None or isinstance(readout, TextReadout)
        return text_director_from_view(view, kernel, readout)
    prefix = view.prefix(view.num_steps - kernel.num_steps)
    return ImageDirector(view.embedding, StochasticRollout(kernel), readout or view.readout_head, prefix)


def load_director(run_dir: str | Path, device: torch.device | str = "cpu") -> tuple[Director, dict[str, Any]]:
    """The distilled DIRECTOR module of a run (eager, eval mode) and its saved payload."""
    payload = load_checkpoint(Path(run_dir) / DIRECTOR_FILE)
    view = load_view(run_dir, device)
    kernel = TransitionKernel(**payload["kernel_args"])
    kernel.load_state_dict(payload["kernel"])
    readout = default_readout(view)
    if payload.get("readout") is not None:
        readout = copy.deepcopy(readout)
        readout.load_state_dict(payload["readout"])
    return director_from_parts(view, kernel.to(device), readout).eval(), payload


def split_sampled_logits(model: torch.nn.Module, split: AnySplit, n_samples: int,
                         device: torch.device | str = "cpu", rows_per_forward: int = 256) -> torch.Tensor:
    """Sampled logits [S, N, C] of an artifact-contract model on an image or text split, in forwards of about
    ``rows_per_forward`` sample rows."""
    if isinstance(split, TokenSplit):
        return text_sampled_logits(model, split, n_samples, rows_per_forward, device=device)
    return sampled_logits(lambda x, s: model(x.to(device), s).cpu(), split.images, n_samples, rows_per_forward)
