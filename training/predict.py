"""Chunked inference helpers: forwards of bounded size are fastest on CPU (DESIGN.md section 7)."""

from __future__ import annotations

from collections.abc import Callable

import torch


@torch.inference_mode()
def chunked(fn: Callable[[torch.Tensor], torch.Tensor], inputs: torch.Tensor, chunk: int = 256,
            dim: int = 0) -> torch.Tensor:
    """Apply ``fn`` to ``inputs`` in chunks along dim 0 and concatenate its outputs along ``dim``."""
    return torch.cat([fn(inputs[i : i + chunk]) for i in range(0, inputs.shape[0], chunk)], dim=dim)


def sampled_logits(model: torch.nn.Module, images: torch.Tensor, n_samples: int, rows_per_forward: int = 256
                   ) -> torch.Tensor:
    """Logits [S, N, C] of an artifact-contract model (``forward(x, n_samples)``), chunked so each forward
    has about ``rows_per_forward`` sample rows."""
    chunk = max(1, rows_per_forward // n_samples)
    return chunked(lambda x: model(x, n_samples), images, chunk, dim=1)
