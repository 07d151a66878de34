"""The frozen teacher as distillation sees it (DESIGN.md section 2): per-step statistics of its trajectory, the
variance temperature tau, the kernel sized to its observed variance, and the diffusion's start states.

Partial depth: with ``depth`` K the first T - K transitions run as the real layers (the prefix) and only the last K
are diffused. The prefix is deterministic, so its output X_{T-K} is computed once per training input
(``start_states``) and an epoch costs only the K teacher and kernel steps.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from models.kernel import TransitionKernel
from training.config import PipelineConfig
from training.data import key_padding
from training.loading import AnySplit, View
from training.metrics import classification_report
from training.objective import ObservedProcess, masked_mean

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


@torch.no_grad()
def select_tau(view: View, prefix: torch.nn.Module, floors: torch.Tensor, split: AnySplit, grid: list[float],
               tolerance: float, device: torch.device, seed: int) -> tuple[float, dict[str, float]]:
    """Largest tau whose S=1 sampled observed process (over the diffused steps, after the deterministic prefix)
    keeps validation accuracy within ``tolerance`` of the backbone's (DESIGN.md section 2)."""
    labels = split.labels
    first_step = view.num_steps - floors.shape[0]
    deterministic = ObservedProcess(view, floors, 0.0, "attention", first_step)  # the backbone's own trajectory
    base = classification_report(view_logits(
        view, split, lambda x0, mask: deterministic.trajectory(prefix(x0, mask), mask)[0][-1], device).softmax(-1),
        labels)
    accuracies = {"backbone": base["accuracy"]}
    chosen = min(grid)
    for tau in sorted(grid, reverse=True):
        torch.manual_seed(seed)
        process = ObservedProcess(view, floors, tau, "attention", first_step)
        logits = view_logits(view, split, lambda x0, mask, p=process: p.sample(prefix(x0, mask), mask), device)
        accuracies[str(tau)] = float((logits.argmax(-1) == labels).float().mean())
        if accuracies[str(tau)] >= base["accuracy"] - tolerance:
            chosen = tau
            break
    return chosen, accuracies


def build_kernel(cfg: PipelineConfig, view: View, floors: torch.Tensor, tau: float,
                 stats: StepStatistics) -> TransitionKernel:
    """A kernel for the diffused steps (``floors`` and ``stats`` cut to them): its initial variance is the mean
    observed level and its log-variance is bounded by [log floor_k, log(4 max var_obs_k)]."""
    if cfg.distil.observed_variance == "floor":
        var_obs_mean, var_obs_max = floors, floors
    else:
        var_obs_mean, var_obs_max = tau * stats.raw_var_mean + floors, tau * stats.raw_var_max + floors
    return TransitionKernel(
        dim=view.dim, num_heads=view.num_heads, num_steps=floors.shape[0], mlp_ratio=cfg.distil.kernel.mlp_ratio,
        logvar_init=math.log(float(var_obs_mean.mean())), logvar_min=floors.log(),
        logvar_max=(4.0 * var_obs_max).log(), frequency_embedding_size=cfg.distil.kernel.frequency_embedding_size,
    )


@dataclass
class StartStates:
    """X_{T-K} of every input of a split (the prefix's output; X_0 when K = T), computed once: states [N, L, D] on
    the CPU, the key padding mask [N, L] (True for real tokens; None for images) and the labels [N]."""

    states: torch.Tensor
    mask: torch.Tensor | None
    labels: torch.Tensor

    @property
    def lengths(self) -> torch.Tensor:
        if self.mask is None:
            return torch.full((self.states.shape[0],), self.states.shape[1])
        return self.mask.sum(dim=1)  # [N]

    def __len__(self) -> int:
        return int(self.states.shape[0])

    def concat(self, other: StartStates) -> StartStates:
        """Both sets of rows; texts padded to the wider of the two (padding is masked)."""
        if self.mask is None or other.mask is None:
            return StartStates(torch.cat([self.states, other.states]), None, torch.cat([self.labels, other.labels]))
        width = max(self.states.shape[1], other.states.shape[1])

        def widen(x: torch.Tensor) -> torch.Tensor:
            pad = [0, 0] * (x.dim() - 2) + [0, width - x.shape[1]]
            return torch.nn.functional.pad(x, pad)  # [N, width, ...]

        return StartStates(torch.cat([widen(self.states), widen(other.states)]),
                           torch.cat([widen(self.mask), widen(other.mask)]), torch.cat([self.labels, other.labels]))

    def rows(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """States [b, l, D] and mask [b, l] of rows ``index``, texts trimmed to the longest of them."""
        if self.mask is None:
            return self.states[index], None
        mask = self.mask[index]  # [b, L]
        width = max(int(mask.sum(dim=1).max()), 1)
        return self.states[index, :width], mask[:, :width]


@torch.no_grad()
def start_states(view: View, prefix: torch.nn.Module, split: AnySplit, device: torch.device) -> StartStates:
    """The diffusion's start state of every input of ``split``: the frozen embedding and prefix, in chunks. Text
    chunks are trimmed to their longest text, so the states are zero-padded back to the widest (padding is masked)."""
    index_and_states = []
    for index in split.chunk_indices(split.teacher_chunk):
        args = tuple(a.to(device) for a in split.forward_args(index))
        index_and_states.append((index, prefix(view.embed(*args), key_padding(args)).float().cpu()))  # [b, l, D]
    width = max(x.shape[1] for _, x in index_and_states)
    states = torch.zeros(len(split), width, view.dim)  # [N, L, D]
    for index, x in index_and_states:
        states[index, : x.shape[1]] = x
    mask = split.key_padding_mask
    return StartStates(states, None if mask is None else mask[:, :width], split.labels)
