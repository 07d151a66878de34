"""What the stages load: the run's fitted backbone, its data, the frozen transition view of the backbone and the
distilled DIRECTOR module. Stages import these from here, never from each other."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

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
__all__ = ["BACKBONE_FILE", "DIRECTOR_FILE", "AnySplit", "Director", "RunBackbone", "View", "load_backbone",
           "run_family", "load_data", "load_view", "load_director", "saved_kernel_config", "split_sampled_logits"]


def run_family(run_dir: str | Path) -> tuple[Family, dict[str, Any]]:
    """The family of a run's fitted backbone (from its checkpoint) and the checkpoint itself."""
    payload = load_checkpoint(Path(run_dir) / BACKBONE_FILE)
    return payload_family(payload), payload


@dataclass
class RunBackbone:
    """A run's fitted backbone read once per command (``backbone.pt`` is loaded by ``open`` and never again): its
    family, its checkpoint payload, the classifier built from it (frozen, eval mode) and what stages derive from it,
    the transition view and the distilled DIRECTOR. For a 0.5B model each load is gigabytes read."""

    run_dir: Path
    family: Family
    payload: dict[str, Any]
    backbone: nn.Module
    device: torch.device | str = "cpu"

    @classmethod
    def open(cls, run_dir: str | Path, device: torch.device | str = "cpu") -> RunBackbone:
        family, payload = run_family(run_dir)
        backbone = family.build_backbone(payload).to(device).eval().requires_grad_(False)
        return cls(Path(run_dir), family, payload, backbone, device)

    def view(self) -> View:
        """A new frozen transition view, on its own copy of the backbone's weights: a stage that folds or casts the
        view's modules for its artifact leaves ``backbone`` as fitted."""
        return self.family.view(copy.deepcopy(self.backbone))

    def director(self) -> tuple[Director, dict[str, Any]]:
        """The distilled DIRECTOR module (eager, eval mode) on a new view, and its saved ``director.pt`` payload."""
        payload = load_checkpoint(self.run_dir / DIRECTOR_FILE)
        view = self.view()
        kernel = TransitionKernel.from_config(saved_kernel_config(payload))
        kernel.load_state_dict(payload["kernel"])
        readout = self.family.default_readout(view)
        if payload.get("readout") is not None:
            readout = copy.deepcopy(readout)
            readout.load_state_dict(payload["readout"])
        return self.family.director(view, kernel.to(self.device), readout).eval(), payload


def load_backbone(run_dir: str | Path, device: torch.device | str = "cpu") -> ImageClassifier | TextClassifier:
    """The fitted backbone of a run, frozen in eval mode."""
    return RunBackbone.open(run_dir, device).backbone


def load_data(cfg: PipelineConfig) -> Dataset | TokenDataset:
    """The run's dataset: images, or texts tokenised with the run's own tokenizer (written by fit-backbone)."""
    return modality_family(cfg.modality).load_data(cfg)


def load_view(run_dir: str | Path, device: torch.device | str = "cpu") -> View:
    """The frozen transition view of a run's fitted backbone (eval mode)."""
    run = RunBackbone.open(run_dir, device)
    return run.family.view(run.backbone)


def saved_kernel_config(payload: dict[str, Any]) -> KernelConfig:
    """The kernel config a ``director.pt`` payload was distilled with; checkpoints written before the config was typed
    hold the constructor's arguments under ``kernel_args``."""
    if "kernel_config" in payload:
        return KernelConfig.from_document(payload["kernel_config"])
    return KernelConfig.from_document(payload["kernel_args"])


def load_director(run_dir: str | Path, device: torch.device | str = "cpu") -> tuple[Director, dict[str, Any]]:
    """The distilled DIRECTOR module of a run (eager, eval mode) and its saved payload."""
    return RunBackbone.open(run_dir, device).director()


def split_sampled_logits(model: torch.nn.Module, split: AnySplit, n_samples: int,
                         device: torch.device | str = "cpu", rows_per_forward: int = 256) -> torch.Tensor:
    """Sampled logits [S, N, C] of an artifact-contract model (``forward(*inputs, n_samples)``) on an image or text
    split, in forwards of about ``rows_per_forward`` sample rows."""
    chunk = max(1, rows_per_forward // n_samples)
    return split.map(lambda *args: model(*args, n_samples).float().cpu(), chunk, device, dim=1)
