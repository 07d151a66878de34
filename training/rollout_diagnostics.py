"""Diagnostics of a DIRECTOR rollout: how large the sampled noise is at each diffused step relative to the state,
and the mean predicted log-variance along the rollout (a DIRECTOR-native OOD score, reported beside the others)."""

from __future__ import annotations

import torch

from training.data import ForwardArgs, key_padding
from training.loading import AnySplit, Director


@torch.no_grad()
def rollout_trace(director: Director, args: ForwardArgs, seed: int) -> tuple[dict[str, list[float]], torch.Tensor]:
    """One S = 1 rollout of the inputs ``args`` ((pixels,) or (ids, mask)): per step the median predicted std over
    RMS(X_t) and the mean predicted log-variance, and per input the DIRECTOR-native OOD score (mean predicted
    log-variance along the rollout, [N]). Texts: every figure over real tokens only."""
    torch.manual_seed(seed)
    rollout = director.rollout
    mask = key_padding(args)  # [B, N] or None
    x = director.prefix(director.embedding(args[0]), mask)  # [B, N, D] X_{T-K}
    ratios, logvars = [], []
    per_input = torch.zeros(args[0].shape[0])
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
    return rollout_trace(director, split.first_args(len(split)), seed)[0]


def mean_logvar_score(director: Director, split: AnySplit, seed: int) -> torch.Tensor:
    """The DIRECTOR-native OOD score of every input of an image or text split [N]."""
    return split.map(lambda *args: rollout_trace(director, args, seed)[1], 256)  # [N]
