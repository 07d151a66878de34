"""The one error of a user's data, ``DataError``, and the check of its classes against a classifier head."""

from __future__ import annotations

from collections.abc import Sequence


class DataError(ValueError):
    """A problem with the user's data, said so that they can fix it: the file, the row, the value, what is expected."""


def preview(labels: Sequence[str], limit: int = 20) -> str:
    """The first ``limit`` class names, for an error message that must stay readable with thousands of classes."""
    shown = ", ".join(repr(name) for name in labels[:limit])
    return f"[{shown}{f', ... ({len(labels)} labels)' if len(labels) > limit else ''}]"


def check_class_count(labels: list[str], num_classes: int, where: str) -> None:
    """The data's classes against the classifier head's outputs (``where`` names the head): the head's index i must
    mean the data's class i, so a different number is an error, never a silent truncation."""
    if len(labels) != num_classes:
        raise DataError(
            f"{where} has {num_classes} classes but the data has {len(labels)}: {preview(labels)}. Give the labels "
            f"in the order of the checkpoint's id2label (integer labels in 0..{num_classes - 1} or its class names), "
            f"or a checkpoint whose head has {len(labels)} outputs")
