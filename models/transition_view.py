"""A backbone re-read as T transitions that each end with attention (docs/method.md, "Re-partition"): what every
family's view shares, and the interface the pipeline holds a view by.

Transition t runs layer t-1's feed-forward sublayer (t > 1) and then layer t's attention sublayer, so one family
differs from another only in those two sublayers, its embedding, its readout and how it packages a transition as a
plain deterministic module (the prefix's and the kernel error's). ``TransitionViewBase`` holds the rest: the step
range, the composition of the two sublayers, and the teacher's last K steps.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn


class TransitionView(Protocol):
    """The frozen teacher as the pipeline uses it (``training.families`` builds one per family)."""

    num_steps: int  # T, the backbone's layers
    dim: int  # D, the residual stream's width
    num_heads: int

    def embed(self, *inputs: torch.Tensor) -> torch.Tensor:
        """The model's inputs -> X_0 [B, N, D]."""
        ...

    def transition(
        self, t: int, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """X_{t-1} [B, N, D] -> (X_t, raw attention-mixture variance of X_t) [B, N, D] each, t in 1..T."""
        ...

    def prefix(self, num_transitions: int) -> nn.Module:
        """Transitions 1..num_transitions as one deterministic module (the part of the stack that is not diffused)."""
        ...

    def teacher_steps(self, depth: int) -> nn.ModuleList:
        """The last ``depth`` transitions T-K+1..T, one deterministic module each (the kernel error's targets)."""
        ...

    def readout(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        """X_T [B, N, D] -> logits [B, C]."""
        ...


class TransitionViewBase(nn.Module):
    """The shared part of every view: subclasses give ``feed_forward``, ``attention_step`` and ``step_module``."""

    num_steps: int
    dim: int
    num_heads: int

    def check_step(self, t: int) -> None:
        if not 1 <= t <= self.num_steps:
            raise ValueError(f"t must be in 1..{self.num_steps}, got {t}")

    def last_steps(self, depth: int) -> range:
        """The step numbers T-K+1..T of the last ``depth`` transitions."""
        if not 1 <= depth <= self.num_steps:
            raise ValueError(f"depth must be in 1..{self.num_steps}, got {depth}")
        return range(self.num_steps - depth + 1, self.num_steps + 1)

    def feed_forward(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """Layer ``layer``'s (1-based) feed-forward sublayer with its norm and residual, [B, N, D] -> [B, N, D]."""
        raise NotImplementedError

    def attention_step(
        self, layer: int, x: torch.Tensor, key_padding_mask: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``layer``'s (1-based) attention sublayer: (its output, its raw mixture variance) [B, N, D] each."""
        raise NotImplementedError

    def step_module(self, t: int) -> nn.Module:
        """Transition t as one deterministic module ``(x, key_padding_mask) -> X_t``."""
        raise NotImplementedError

    def transition(
        self, t: int, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """X_{t-1} [B, N, D] -> (X_t, raw variance of X_t) [B, N, D] each, t in 1..T."""
        self.check_step(t)
        if t > 1:
            x = self.feed_forward(t - 1, x)  # [B, N, D] = h_{t-1}
        return self.attention_step(t, x, key_padding_mask)

    def teacher_steps(self, depth: int) -> nn.ModuleList:
        """The last ``depth`` transitions T-K+1..T, one deterministic module each (the kernel error's targets)."""
        return nn.ModuleList(self.step_module(t) for t in self.last_steps(depth))
