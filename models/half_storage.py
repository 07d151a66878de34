"""Linear layers stored in half precision and computed in float32: the large text layers (the deterministic prefix and
the readout's feed-forward sublayer) take half the bytes in an artifact, with one float32 copy made on first use.

The copy lives in a buffer that ``forward`` fills (TorchScript allows it), so a loaded artifact pays the conversion
once per device instead of per forward, and the file holds only the float16 weights.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class HalfStoredLinear(nn.Module):
    """``nn.Linear`` with its weight stored as float16 (bias float32); [.., in] -> [.., out] in float32."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.register_buffer("weight_half", linear.weight.detach().half().clone())  # [out, in]
        bias = linear.bias.detach().float().clone() if linear.bias is not None else torch.zeros(linear.out_features)
        self.register_buffer("bias", bias)  # [out]
        self.register_buffer("weight_cache", torch.zeros(0), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight_cache.numel() == 0 or self.weight_cache.device != x.device:
            self.weight_cache = self.weight_half.to(x.device).float()  # [out, in] once per device
        return F.linear(x, self.weight_cache, self.bias)


def store_linears_in_half(module: nn.Module) -> nn.Module:
    """Replace every ``nn.Linear`` inside ``module`` (in place) by a ``HalfStoredLinear``; returns ``module``."""
    for name, child in list(module.named_modules()):
        if isinstance(child, nn.Linear):
            parent_name, _, attr = name.rpartition(".")
            setattr(module.get_submodule(parent_name) if parent_name else module, attr, HalfStoredLinear(child))
    return module
