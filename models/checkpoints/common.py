"""Helpers both converters share: class names in index order, fresh copies of linear layers, and the GELU check
that names the model it refuses."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from models.text_layers import gelu_approximation


def checked_gelu(act: nn.Module, where: str) -> str:
    """``gelu_approximation`` with the model named in the refusal."""
    try:
        return gelu_approximation(act)
    except ValueError as err:
        raise ValueError(f"{where}: only GELU activations (exact or tanh) are supported, got {type(act).__name__}"
                         ) from err


def copy_linear(linear: nn.Linear) -> nn.Linear:
    """A fresh ``nn.Linear`` holding a copy of ``linear``'s weights (no shared storage, no foreign attributes)."""
    out = nn.Linear(linear.in_features, linear.out_features, bias=linear.bias is not None)
    with torch.no_grad():
        out.weight.copy_(linear.weight)
        if linear.bias is not None:
            out.bias.copy_(linear.bias)
    return out


def ordered_labels(id2label: dict[Any, str] | None, num_classes: int) -> list[str] | None:
    """``id2label`` as a list in index order (keys may be ints or their strings), None without a full table."""
    if not id2label:
        return None
    table = {int(k): str(v) for k, v in id2label.items()}
    if sorted(table) != list(range(num_classes)):
        return None
    return [table[i] for i in range(num_classes)]
