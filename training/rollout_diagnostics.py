"""Diagnostics of a DIRECTOR rollout: how large the sampled noise is at each diffused step relative to the state,
and the mean predicted log-variance along the rollout (a DIRECTOR-native OOD score, reported beside the others)."""

from __future__ import annotations

import torch

from models.director import ImageDirector
from models.text_director import TextDirector
from training.data import Split
from training.loading import AnySplit, Director
from training.predict import chunked
from training.text_inputs import TokenSplit, text_outputs


@torch.no_grad()
def rollout_trace(director: ImageDirector | TextDirector, images: torch.Tensor, seed: int,
                  attention_mask: torch.Tensor | None = None) -> tuple[dict[str, list[float]], torch.Tensor]:
    """One S = 1 rollout: per step the median predicted std over RMS(X_t) and the mean predicted
    log-variance, and per input the DIRECTOR-native OOD score (mean predicted log-variance along the
    rollout, [N]). Text: ``images`` are input ids and ``attention_mask`` [N, L] limits every figure to real
    tokens."""
    torch.manual_seed(seed)
    rollout = director.rollout
    mask = None if attention_mask is None else attention_mask > 0  # [B, N]
    x = director.prefix(director.embedding(images), mask)  # [B, N, D] X_{T-K}
    ratios, logvars = [], []
    per_input = torch.zeros(images.shape[0])
    for t in range(1, rollout.num_steps + 1):
        mean, std = rollout.step(x, t, mask)  # [B, N, D]
        x = mean + std * torch.randn_like(mean)
        logvar = 2 * std.log()  # [B, N, D]
        if mask is None:
            ratios.append(float(std.median() / x.square().mean().sqrt()))
            logvars.append(float(logvar.mean()))
            per_input += logvar.mean(dim=(1, 2)) / rollout.num_steps
        else:
            ratios.append(float(std[mask].median() / x[mask].square().mean().sqrt()))
            logvars.append(float(logvar[mask].mean()))
            real = mask.to(logvar.dtype).unsqueeze(-1)  # [B, N, 1]
            per_input += (logvar * real).sum(dim=(1, 2)) / (real.sum(dim=(1, 2)) * logvar.shape[-1]) / rollout.num_steps
    return {"median_std_over_rms": ratios, "mean_logvar": logvars}, per_input


def split_rollout_trace(director: Director, split: AnySplit, seed: int) -> dict[str, list[float]]:
    """``rollout_trace``'s per-step figures on a whole split (one forward)."""
    if isinstance(split, TokenSplit):
        ids, mask = split.rows(torch.arange(len(split)))
        return rollout_trace(director, ids, seed, mask)[0]
    return rollout_trace(director, split.images, seed)[0]


def mean_logvar_score(director: Director, images: torch.Tensor | AnySplit, seed: int) -> torch.Tensor:
    """The DIRECTOR-native OOD score of every input [N] (images, an image split or a tokenised text split)."""
    if isinstance(images, Split):
        images = images.images
    if isinstance(images, TokenSplit):
        return text_outputs(lambda ids, mask: rollout_trace(director, ids, seed, mask)[1], images, 256)  # [N]
    return chunked(lambda x: rollout_trace(director, x, seed)[1], images, 256)  # [N]
