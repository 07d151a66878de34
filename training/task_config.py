"""The config section ``task``: whether the classifier is single-label (a softmax over the classes) or multi-label (a
sigmoid per label, ``models.tasks``), and how a multi-label model's calibration is chosen on validation."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pydantic import ConfigDict

from models.tasks import MULTI_LABEL, Task, task_for
from training.data.sources.multi_label_images import MultiLabelColumns


@dataclass
class TaskConfig:
    __pydantic_config__ = ConfigDict(extra="forbid")
    kind: Literal["single_label", "multi_label"] = "single_label"
    # multi-label data: one 0/1 column per label, named here in the head's order (empty: data.label_column holds
    # each row's list of labels)
    label_columns: list[str] = field(default_factory=list)
    image_column: str = "image"  # multi-label images: the table's column of image paths
    thresholds: Literal["f1", "fixed"] = "f1"  # per label: the best validation F1, or fixed at 0.5 for every label
    temperature: Literal["auto", "one", "per_label"] = "auto"  # auto: per label when it wins on held-out validation

    @property
    def multi_label(self) -> bool:
        return self.kind == MULTI_LABEL

    def image_columns(self, label_column: str) -> MultiLabelColumns | None:
        """Where a multi-label image table holds its images and labels (None: single-label, an image folder)."""
        if not self.multi_label:
            return None
        return MultiLabelColumns(self.image_column, label_column, self.label_columns or None)

    def task(self) -> Task:
        """The task's maths before any calibration is fitted (``models.tasks``)."""
        return task_for(self.kind)
