"""What the stages load: the run's fitted backbone, its data, the frozen transition view of the backbone and the
distilled DIRECTOR module. Stages import these from here, never from each other."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch

from models.backbones import ImageClassifier
from models.kernel import KernelConfig, TransitionKernel
from models.text_backbones import TextClassifier
from training.config import PipelineConfig
from training.data.images import Dataset, Split
from training.data.tokens import TokenDataset, TokenSplit
from training.families.base import Director, Family, View
from training.families.registry import modality_family, payload_family
from training.runtime import load_checkpoint

BACKBONE_FILE = "backbone.pt"
DIRECTOR_FILE = "director.pt"
AnySplit = Split | TokenSplit
__all__ = ["BACKBONE_FILE", "DIRECTOR_FILE", "AnySplit", "Director", "View", "load_backbone", "run_family",
           "load_data", "load_view", "load_director", "saved_kernel_config", "split_sampled_logits"]


def run_family(run_dir: str | Path) -> tuple[Family, dict[str, Any]]:
    """The family of a run's fitted backbone (from its checkpoint) and the checkpoint itself."""
    payload = load_checkpoint(Path(run_dir) / BACKBONE_FILE)
    return payload_family(payload), payload


def load_backbone(run_dir: str | Path, device: torch.device | str = "cpu") -> ImageClassifier | TextClassifier:
    """The fitted backbone of a run, frozen in eval mode."""
    family, payload = run_family(run_dir)
    return family.build_backbone(payload).to(device).eval().requires_grad_(False)


def load_data(cfg: PipelineConfig) -> Dataset | TokenDataset:
    """The run's dataset: images, or texts tokenised with the run's own tokenizer (written by fit-backbone)."""
    return modality_family(cfg.modality).load_data(cfg)


def load_view(run_dir: str | Path, device: torch.device | str = "cpu") -> View:
    """The frozen transition view of a run's fitted backbone (eval mode)."""
    family, payload = run_family(run_dir)
    return family.view(family.build_backbone(payload).to(device).eval().requires_grad_(False))


def saved_kernel_config(payload: dict[str, Any]) -> KernelConfig:
    """The kernel config a ``director.pt`` payload was distilled with; checkpoints written before the config was typed
    hold the constructor's arguments under ``kernel_args``."""
    if "kernel_config" in payload:
        return KernelConfig.from_document(payload["kernel_config"])
    return KernelConfig.from_document(payload["kernel_args"])


def load_director(run_dir: str | Path, device: torch.device | str = "cpu") -> tuple[Director, dict[str, Any]]:
    """The distilled DIRECTOR module of a run (eager, eval mode) and its saved payload."""
    payload = load_checkpoint(Path(run_dir) / DIRECTOR_FILE)
    family, _ = run_family(run_dir)
    view = load_view(run_dir, device)
    kernel = TransitionKernel.from_config(saved_kernel_config(payload))
    kernel.load_state_dict(payload["kernel"])
    readout = family.default_readout(view)
    if payload.get("readout") is not None:
        readout = copy.deepcopy(readout)
        readout.load_state_dict(payload["readout"])
    return family.director(view, kernel.to(device), readout).eval(), payload


def split_sampled_logits(model: torch.nn.Module, split: AnySplit, n_samples: int,
                         device: torch.device | str = "cpu", rows_per_forward: int = 256) -> torch.Tensor:
    """Sampled logits [S, N, C] of an artifact-contract model (``forward(*inputs, n_samples)``) on an image or text
    split, in forwards of about ``rows_per_forward`` sample rows."""
    chunk = max(1, rows_per_forward // n_samples)
    return split.map(lambda *args: model(*args, n_samples).float().cpu(), chunk, device, dim=1)
