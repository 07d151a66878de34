"""Diagnostics of a DIRECTOR rollout: how large the sampled noise is at each diffused step relative to the state,
the mean predicted log-variance along the rollout (a DIRECTOR-native OOD score, reported beside the others), and
whether the predicted variance grows where the kernel's own error against the backbone grows."""

from __future__ import annotations

from typing import Any

import torch
from scipy.stats import spearmanr

from models.director import per_input_mean
from training.data.images import ForwardArgs, key_padding
from training.loading import AnySplit, Director, View
from training.ood_metrics import auroc


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
        else:
            ratios.append(float(std[mask].median() / x[mask].square().mean().sqrt()))
            logvars.append(float(logvar[mask].mean()))
        per_input += per_input_mean(logvar, mask) / rollout.num_steps
    return {"median_std_over_rms": ratios, "mean_logvar": logvars}, per_input


def split_rollout_trace(director: Director, split: AnySplit, seed: int) -> dict[str, list[float]]:
    """``rollout_trace``'s per-step figures on a whole split (one forward)."""
    return rollout_trace(director, split.first_args(len(split)), seed)[0]


def mean_logvar_score(director: Director, split: AnySplit, seed: int) -> torch.Tensor:
    """The DIRECTOR-native OOD score of every input of an image or text split [N]."""
    return split.map(lambda *args: rollout_trace(director, args, seed)[1], 256)  # [N]


@torch.no_grad()
def error_and_variance(director: Director, view: View, args: ForwardArgs) -> torch.Tensor:
    """Per input [B, 2]: the kernel's squared mean error against the backbone's next state, and its predicted variance
    (without the served noise temperature), each averaged over the K diffused steps along the backbone's own
    trajectory (teacher forcing; at K = 1 that is the rollout's one step), real tokens and features. The KL's optimum
    is var_q + error, so a variance head that learned where the kernel errs predicts more where the first is larger."""
    rollout = director.rollout
    mask = key_padding(args)  # [B, N] or None
    x = director.prefix(director.embedding(args[0]), mask)  # [B, N, D] X_{T-K}
    first = int(view.num_steps) - rollout.num_steps
    out = torch.zeros(args[0].shape[0], 2)  # [B, 2]
    for t in range(1, rollout.num_steps + 1):
        mean, std = rollout.step(x, t, mask)  # [B, N, D]
        target, _ = view.transition(first + t, x, mask)  # [B, N, D] the backbone's X_{T-K+t}
        out[:, 0] += per_input_mean((mean - target).square(), mask).cpu() / rollout.num_steps
        out[:, 1] += per_input_mean((std / rollout.noise_scale).square(), mask).cpu() / rollout.num_steps
        x = target
    return out


class KernelErrors:
    """``error_and_variance`` of every input of named sets, each set computed once: the evaluation's OOD tables (the
    error as a score) and its variance stage read the same values."""

    def __init__(self, director: Director, view: View) -> None:
        self.director = director
        self.view = view
        self.values: dict[str, torch.Tensor] = {}

    def __call__(self, name: str, split: AnySplit) -> torch.Tensor:
        """[N, 2] (error, variance) of the set ``name``."""
        if name not in self.values:
            self.values[name] = split.map(lambda *args: error_and_variance(self.director, self.view, args), 256)
        return self.values[name]


def rank_correlation(a: torch.Tensor, b: torch.Tensor) -> float | None:
    """Spearman's correlation of two [N] vectors; None where it is undefined (a constant vector)."""
    if bool((a == a[0]).all()) or bool((b == b[0]).all()):
        return None
    return float(spearmanr(a.numpy(), b.numpy())[0])


def variance_report(errors: KernelErrors, test: AnySplit, ood_sets: dict[str, AnySplit]) -> dict[str, Any]:
    """Does the predicted variance follow the kernel's own error? Per set (the test split and every OOD set): the mean
    squared error and the mean predicted variance, their Spearman correlation over the set's inputs, and (OOD sets)
    the AUROC of each against the test split: the error's is what a variance head that predicted it exactly would
    reach as an OOD score."""
    sets = {"test": test, **ood_sets}
    values = {name: errors(name, split) for name, split in sets.items()}  # [N, 2] each
    out: dict[str, Any] = {}
    for name, v in values.items():  # v [N, 2]: error, variance
        entry = {"mean_error": float(v[:, 0].mean()), "mean_variance": float(v[:, 1].mean()),
                 "spearman": rank_correlation(v[:, 0], v[:, 1])}
        if name != "test":
            entry["auroc_error"] = auroc(values["test"][:, 0], v[:, 0])
            entry["auroc_variance"] = auroc(values["test"][:, 1], v[:, 1])
        out[name] = entry
    return out
