"""The pipeline's figures for either task (``models.tasks``): one report of probabilities against labels, the
single-label metrics (``training.metrics``) or the multi-label ones (``training.multi_label_metrics``)."""

from __future__ import annotations

import torch

from models.tasks import MultiLabel, Task
from training.metrics import classification_report
from training.multi_label_metrics import multi_label_report


def task_report(task: Task, probs: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """Accuracy, NLL, ECE and the rest of ``probs [N, C]`` against ``labels`` (indices [N] or indicators [N, C]);
    a multi-label model's at its own thresholds."""
    if isinstance(task, MultiLabel):
        thresholds = None if task.thresholds is None else task.thresholds.tolist()
        return multi_label_report(probs, labels, thresholds)
    return classification_report(probs, labels)


def logits_report(task: Task, logits: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """``task_report`` of sampled logits [S, N, C] (or one draw [N, C]) summarised by the task."""
    z = logits if logits.dim() == 3 else logits.unsqueeze(0)  # [S, N, C]
    return task_report(task, task.summarize(z).probabilities, labels)
