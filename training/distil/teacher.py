"""The frozen teacher as distillation sees it (docs/method.md): per-step statistics of its trajectory, the
variance temperature tau, the kernel sized to its observed variance, and the diffusion's start states.

Partial depth: with ``depth`` K the first T - K transitions run as the real layers (the prefix) and only the last K
are diffused. The prefix is deterministic, so its output X_{T-K} is computed once per training input
(``start_states``) and an epoch costs only the K teacher and kernel steps.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from models.kernel import KernelConfig
from models.tasks import SOFTMAX, Task
from training.config import PipelineConfig
from training.data.images import key_padding
from training.distil.objective import ObservedProcess, masked_mean
from training.loading import AnySplit, View
from training.runtime import load_checkpoint, save_checkpoint
from training.tasks import logits_report

STATISTICS_FILE = "teacher_statistics.pt"  # the run's step statistics, shared by every depth (``shared_statistics``)
Rollout = Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor]  # (X_0 [B, N, D], mask) -> X_T


def diffused_depth(cfg: PipelineConfig, view: View) -> int:
    """K, the number of transitions the kernel diffuses (``distil.depth``; None = the whole stack)."""
    depth = cfg.distil.depth if cfg.distil.depth is not None else view.num_steps
    if not 1 <= depth <= view.num_steps:
        raise ValueError(f"distil.depth must be in 1..{view.num_steps} for this backbone, got {depth}")
    return depth


def read_out(view: View, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """The view's readout of X_T [B, N, D] (pooling over real tokens when ``mask`` [B, N] is given) -> [B, C]."""
    return view.readout(x) if mask is None else view.readout(x, mask)


def embedded_chunks(view: View, source: AnySplit, device: torch.device, batch_size: int
                    ) -> Iterator[tuple[torch.Tensor, torch.Tensor | None]]:
    """X_0 [b, N, D] and the key padding mask [b, N] (None for images) of ``source`` in chunks (texts by length)."""
    for index in source.chunk_indices(batch_size):
        args = tuple(a.to(device) for a in source.forward_args(index))
        yield view.embed(*args), key_padding(args)


def view_logits(view: View, split: AnySplit, rollout: Rollout, device: torch.device) -> torch.Tensor:
    """Readout logits [N, C] of ``rollout(X_0, mask) -> X_T`` over a split, chunked."""

    def fn(*args: torch.Tensor) -> torch.Tensor:
        mask = key_padding(args)  # [b, l] or None
        return read_out(view, rollout(view.embed(*args), mask), mask).float().cpu()

    return split.map(fn, split.teacher_chunk, device)


@dataclass
class StepStatistics:
    """Per-step statistics of the observed process, gathered once before training (all [T], or [K] once cut)."""

    mean_square: torch.Tensor  # mean(X_t^2)
    raw_var_mean: torch.Tensor  # mean attention mixture variance
    raw_var_max: torch.Tensor  # max attention mixture variance

    def floors(self, fraction: float) -> torch.Tensor:
        return fraction * self.mean_square

    def last(self, depth: int) -> StepStatistics:
        """The statistics of the last ``depth`` transitions (the diffused ones)."""
        return StepStatistics(self.mean_square[-depth:], self.raw_var_mean[-depth:], self.raw_var_max[-depth:])


@torch.no_grad()
def gather_step_statistics(view: View, inputs: AnySplit, device: torch.device,
                           batch_size: int = 128) -> StepStatistics:
    """Per-step statistics of the backbone's own trajectory on ``inputs`` (texts: over real tokens only)."""
    sums = torch.zeros(view.num_steps)
    var_sums = torch.zeros(view.num_steps)
    var_max = torch.zeros(view.num_steps)
    count = 0
    for x, mask in embedded_chunks(view, inputs, device, batch_size):
        weight = x.shape[0] if mask is None else int(mask.sum())  # images, or real tokens
        for t in range(1, view.num_steps + 1):
            x, var = view.transition(t, x, mask)
            if mask is None:
                sums[t - 1] += float(x.float().square().mean()) * weight
                var_sums[t - 1] += float(var.mean()) * weight
                var_max[t - 1] = max(float(var_max[t - 1]), float(var.max()))
            else:
                sums[t - 1] += float(masked_mean(x.float().square(), mask)) * weight
                var_sums[t - 1] += float(masked_mean(var, mask)) * weight
                var_max[t - 1] = max(float(var_max[t - 1]), float(var[mask].max()))
        count += weight
    return StepStatistics(sums / count, var_sums / count, var_max)


def shared_statistics(path: Path, key: dict[str, Any], gather: Callable[[], StepStatistics]) -> StepStatistics:
    """The step statistics of every transition, which do not depend on K, gathered once per run: read from ``path``
    (in a depth's sub-run a link to the run's file, ``STATISTICS_FILE``) when they were gathered for the same ``key``
    (the backbone file and the inputs), else gathered and written there for the next depth."""
    if path.exists():
        saved = load_checkpoint(path)
        if saved.get("key") == key:
            return StepStatistics(**saved["stats"])
    stats = gather()
    if not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0:  # one writer under DDP
        save_checkpoint(path.resolve(), {"key": key, "stats": vars(stats)})
    return stats


def statistics_key(backbone: Path, inputs: int) -> dict[str, Any]:
    """What the step statistics were gathered from: the backbone file as written (a new fit writes a new one) and the
    number of training inputs read."""
    stat = backbone.resolve().stat()
    return {"backbone_bytes": stat.st_size, "backbone_mtime_ns": stat.st_mtime_ns, "inputs": inputs}


@torch.no_grad()
def select_tau(view: View, prefix: torch.nn.Module, floors: torch.Tensor, split: AnySplit, grid: list[float],
               tolerance: float, device: torch.device, seed: int, task: Task = SOFTMAX
               ) -> tuple[float, dict[str, float]]:
    """Largest tau whose S=1 sampled observed process (over the diffused steps, after the deterministic prefix)
    keeps validation accuracy within ``tolerance`` of the backbone's (docs/method.md)."""
    labels = split.labels
    first_step = view.num_steps - floors.shape[0]
    deterministic = ObservedProcess(view, floors, 0.0, "attention", first_step)  # the backbone's own trajectory
    base = logits_report(task, view_logits(
        view, split, lambda x0, mask: deterministic.trajectory(prefix(x0, mask), mask)[0][-1], device), labels)
    accuracies = {"backbone": base["accuracy"]}
    chosen = min(grid)
    for tau in sorted(grid, reverse=True):
        torch.manual_seed(seed)
        process = ObservedProcess(view, floors, tau, "attention", first_step)
        logits = view_logits(view, split, lambda x0, mask, p=process: p.sample(prefix(x0, mask), mask), device)
        accuracies[str(tau)] = logits_report(task, logits, labels)["accuracy"]
        if accuracies[str(tau)] >= base["accuracy"] - tolerance:
            chosen = tau
            break
    return chosen, accuracies


def kernel_config(cfg: PipelineConfig, view: View, floors: torch.Tensor, tau: float, stats: StepStatistics,
                  causal: bool = False) -> KernelConfig:
    """The kernel for the diffused steps (``floors`` and ``stats`` cut to them): its initial variance is the mean
    observed level and its log-variance is bounded by [log floor_k, log(4 max var_obs_k)]; its attention is causal
    when the backbone's is (decoders)."""
    if cfg.distil.observed_variance == "floor":
        var_obs_mean, var_obs_max = floors, floors
    else:
        var_obs_mean, var_obs_max = tau * stats.raw_var_mean + floors, tau * stats.raw_var_max + floors
    return KernelConfig(
        dim=view.dim, num_heads=view.num_heads, depth=floors.shape[0], mlp_ratio=cfg.distil.kernel.mlp_ratio,
        frequency_embedding_size=cfg.distil.kernel.frequency_embedding_size, causal=causal,
        logvar_init=math.log(float(var_obs_mean.mean())), logvar_min=floors.log(), logvar_max=(4.0 * var_obs_max).log(),
    )
