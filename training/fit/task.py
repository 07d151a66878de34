"""What the fit loop (``training.fit.backbone``) needs from the backbone it fits: ``FitTask``, one per kind of
backbone (the pipeline's own ViT or text encoder, or a user's pretrained checkpoint)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from models.tasks import SOFTMAX, Task
from training.loading import AnySplit
from training.tasks import logits_report

Batch = tuple[tuple[torch.Tensor, ...], torch.Tensor]  # (model inputs, labels)


def evaluate_backbone(model: torch.nn.Module, split: AnySplit, device: torch.device, chunk: int = 512,
                      task: Task = SOFTMAX) -> dict[str, float]:
    """Accuracy, ECE and NLL of a classifier (``model(*inputs) -> [B, C]``) on an image or text split."""
    model.eval()
    logits = split.map(lambda *args: model(*args).float().cpu(), chunk, device)  # [N, C]
    return logits_report(task, logits, split.labels)


@dataclass
class FitTask:
    """What the fit loop needs from a modality."""

    model: nn.Module
    train_size: int
    train_batches: Callable[[torch.Generator], Iterator[Batch]]  # one epoch, order fixed by the generator
    evaluate: Callable[[nn.Module, str], dict[str, float]]  # (model, "val" | "test") -> classification report
    payload: dict[str, Any]  # modality-specific entries of backbone.pt
    epochs: int | None = None  # None: fit.epochs (0: a pretrained classifier used as it is)
