"""Stage 2: distil the frozen backbone into one time-conditioned DiT kernel (docs/method.md).

Runs unchanged under ``torchrun`` (DDP, gloo on CPU / nccl on GPU): each rank takes a disjoint shard of every
epoch's batches; rank 0 validates and writes checkpoints.

The steps: prepare the teacher (step statistics, tau, the kernel sized to the observed variance), compute the start
states X_{T-K} once (partial depth: the first T - K transitions are the real layers and never change), then train
epochs of the K diffused steps. An exponential moving average of the trainable weights (``distil.ema_decay``) is
what gets validated, and the weights with the best validation NLL are what the run keeps (``distil.keep_best``).
With ``distil.unlabeled_copies`` (and, for text, ``distil.unlabeled_corpus``) the kernel also learns on perturbed
copies of the training inputs (and an unlabeled corpus) against the teacher's own outputs (``training.data.unlabeled``).
Text batches carry a key padding mask: padding is masked in the teacher's and the kernel's attention, the KL and the
readout's pooling.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from tqdm import tqdm

from models.kernel import TransitionKernel
from training.config import PipelineConfig, config_dict
from training.data.images import Dataset
from training.data.tokens import TokenDataset, bucketed_indices
from training.distil.objective import DistillationLoss, LossWeights, ObservedProcess
from training.distil.start_states import StartStates, start_states
from training.distil.teacher import (
    StepStatistics,
    build_kernel,
    diffused_depth,
    gather_step_statistics,
    select_tau,
)
from training.families.base import Family
from training.loading import (
    DIRECTOR_FILE,
    AnySplit,
    Director,
    View,
    load_data,
    load_view,
    run_family,
    split_sampled_logits,
)
from training.metrics import classification_report
from training.runtime import (
    DistInfo,
    autocast,
    data_parallel,
    init_distributed,
    load_checkpoint,
    save_checkpoint,
    seed_everything,
    select_device,
    set_threads,
    warmup_cosine,
)

CHECKPOINT_FILE = "director_ckpt.pt"


@torch.no_grad()
def validate(model: Director, split: AnySplit, n_samples: int, device: torch.device) -> dict[str, float]:
    model.eval()
    logits = split_sampled_logits(model, split, n_samples, device)  # [S, N, C]
    return classification_report(logits.softmax(-1).mean(0), split.labels)


@dataclass
class Teacher:
    """What distillation fixes before the first step: statistics of all T steps, K, floors and tau."""

    stats: StepStatistics  # all T transitions
    depth: int  # K, the diffused transitions
    floors: torch.Tensor  # [K]
    tau: float
    tau_accuracies: dict[str, float]


def prepare_teacher(cfg: PipelineConfig, family: Family, view: View, prefix: torch.nn.Module, data: Any,
                    device: torch.device, state: dict[str, Any] | None, verbose: bool) -> Teacher:
    """Gather the step statistics and select tau, or take both from a checkpoint being resumed."""
    dcfg = cfg.distil
    depth = diffused_depth(cfg, view)
    if state is not None:
        stats = StepStatistics(**state["stats"])
        return Teacher(stats, depth, stats.last(depth).floors(dcfg.floor_fraction), state["tau"],
                       state["tau_accuracies"])
    stats_inputs = data.train.head(dcfg.stats_batches * 128)
    stats = gather_step_statistics(view, stats_inputs, device, family.stats_chunk)
    floors = stats.last(depth).floors(dcfg.floor_fraction)
    if dcfg.observed_variance == "floor":
        tau, tau_accuracies = 0.0, {}
    elif dcfg.tau is not None:
        tau, tau_accuracies = dcfg.tau, {}
    else:
        tau, tau_accuracies = select_tau(view, prefix, floors, data.val.head(dcfg.tau_images), dcfg.tau_grid,
                                         dcfg.tau_tolerance, device, cfg.seed)
    if verbose:
        print(f"depth {depth} of {view.num_steps}; observed variance: {dcfg.observed_variance}, tau={tau} "
              f"(S=1 val accuracy {tau_accuracies})")
    return Teacher(stats, depth, floors, tau, tau_accuracies)


def unlabeled_inputs(cfg: PipelineConfig, family: Family, data: Dataset | TokenDataset) -> AnySplit | None:
    """``distil.unlabeled_copies`` perturbed copies of the training inputs and the ``distil.unlabeled_corpus``
    sentences (``training.data.unlabeled``); None when the config asks for neither."""
    if cfg.distil.unlabeled_copies == 0 and cfg.distil.unlabeled_corpus is None:
        return None
    return family.unlabeled(cfg, data, cfg.distil.unlabeled_copies, cfg.seed + 101)


def epoch_batches(cfg: PipelineConfig, starts: StartStates, gen: torch.Generator, dist_info: DistInfo
                  ) -> Iterator[tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]]:
    """One epoch of (start states [b, l, D], key padding mask [b, l] or None, labels [b]); texts length-bucketed."""
    dcfg = cfg.distil
    bucket = cfg.text.bucket if starts.mask is not None else 1
    for index in bucketed_indices(starts.lengths, dcfg.batch_size, True, gen, dist_info.rank,
                                  dist_info.world_size, bucket):
        states, mask = starts.rows(index)
        yield states, mask, starts.labels[index]


class Trainables(torch.nn.Module):
    """The trained parts (kernel, readout) as one module, so their moving average and checkpoints are one thing."""

    def __init__(self, kernel: TransitionKernel, readout: torch.nn.Module) -> None:
        super().__init__()
        self.kernel = kernel
        self.readout = readout


def moving_average(parts: Trainables, decay: float) -> AveragedModel | None:
    """An EMA of the trainable weights (None when ``decay`` is 0)."""
    if decay <= 0:
        return None
    return AveragedModel(parts, multi_avg_fn=get_ema_multi_avg_fn(decay), use_buffers=True)


@dataclass
class DistilResult:
    path: Path
    kernel: TransitionKernel  # this rank's trained kernel (equal on every rank after DDP training)


def distil(cfg: PipelineConfig, resume: bool = True) -> DistilResult:
    """Train the kernel (resumable, one checkpoint per epoch); write ``director.pt`` with the kept weights."""
    dist_info = init_distributed(cfg.device)
    run_dir = Path(cfg.run_dir)
    ckpt_path, final_path = run_dir / CHECKPOINT_FILE, run_dir / DIRECTOR_FILE
    set_threads(cfg.threads)
    seed_everything(cfg.seed)
    device = select_device(cfg.device, dist_info)
    dcfg = cfg.distil
    if not (run_dir / "backbone.pt").exists():
        raise FileNotFoundError(f"no fitted backbone in {run_dir}: run `python -m training fit-backbone` first")
    data = load_data(cfg)
    family, _ = run_family(run_dir)
    view = load_view(run_dir, device)  # frozen, eval()
    depth = diffused_depth(cfg, view)
    prefix = view.prefix(view.num_steps - depth).to(device).eval()
    state = load_checkpoint(ckpt_path) if resume and ckpt_path.exists() else None
    t_start = time.perf_counter()
    teacher = prepare_teacher(cfg, family, view, prefix, data, device, state, dist_info.is_main)
    if state is not None:
        print(f"resuming distillation at epoch {state['epoch']}")

    kernel = build_kernel(cfg, view, teacher.floors, teacher.tau, teacher.stats.last(depth), family.causal).to(device)
    kernel_args = {"dim": kernel.dim, "num_heads": view.num_heads, "num_steps": depth,
                   "mlp_ratio": dcfg.kernel.mlp_ratio, "frequency_embedding_size": dcfg.kernel.frequency_embedding_size,
                   "logvar_init": float(kernel.var_head.bias.detach()[0]), "logvar_min": kernel.logvar_min.cpu(),
                   "logvar_max": kernel.logvar_max.cpu(), "causal": family.causal}
    readout = family.default_readout(view)
    if dcfg.finetune_readout:
        readout = copy.deepcopy(readout).requires_grad_(True)
    parts = Trainables(kernel, readout)
    process = ObservedProcess(view, teacher.floors, teacher.tau, dcfg.observed_variance, view.num_steps - depth)
    weights = LossWeights(dcfg.lambda_1, dcfg.lambda_2, dcfg.beta_nll, dcfg.mean_mse_weight, dcfg.l1_on_rollout,
                          dcfg.train_samples, dcfg.l2_target)
    objective = DistillationLoss(kernel, readout, process, weights).to(device)
    trainable = [p for p in objective.parameters() if p.requires_grad]
    model = data_parallel(objective, device, dist_info)
    optimizer = torch.optim.AdamW(trainable, lr=dcfg.lr, weight_decay=dcfg.weight_decay)
    unlabeled = unlabeled_inputs(cfg, family, data)  # the teacher's targets only
    inputs = len(data.train) + (len(unlabeled) if unlabeled is not None else 0)
    steps_per_epoch = -(-inputs // (dcfg.batch_size * dist_info.world_size))
    total_steps = steps_per_epoch * dcfg.epochs
    if dcfg.max_steps is not None:
        total_steps = min(total_steps, dcfg.max_steps)
    scheduler = warmup_cosine(optimizer, dcfg.warmup_steps, total_steps)
    ema = moving_average(parts, dcfg.ema_decay)
    start_epoch, step, history, elapsed, best = 0, 0, [], 0.0, None
    if state is not None:
        parts.load_state_dict(state["parts"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        if ema is not None:
            ema.load_state_dict(state["ema"])
        start_epoch, step, history, elapsed, best = (state["epoch"], state["step"], state["history"],
                                                     state["elapsed"], state["best"])
    inputs_to_diffuse = [data.train] if unlabeled is None else [data.train, unlabeled]
    starts = start_states(view, prefix, inputs_to_diffuse, device, dcfg.start_states_memory_bytes,
                          run_dir / f"rank-{dist_info.rank}")  # X_{T-K} of every training input, once
    elapsed += time.perf_counter() - t_start

    gen = torch.Generator().manual_seed(cfg.seed)
    for epoch in range(start_epoch, dcfg.epochs):
        if step >= total_steps:
            break
        gen.manual_seed(cfg.seed * 1000 + epoch)
        torch.manual_seed(cfg.seed * 1000 + epoch + 7919 * dist_info.rank)
        t0 = time.perf_counter()
        objective.train()
        readout.train(dcfg.finetune_readout)
        sums: dict[str, torch.Tensor] = {}
        count = 0
        bar = tqdm(epoch_batches(cfg, starts, gen, dist_info), total=steps_per_epoch,
                   desc=f"distil epoch {epoch + 1}/{dcfg.epochs}", leave=False, disable=not dist_info.is_main)
        for x_start, mask, labels in bar:
            with autocast(device, cfg.bf16):
                loss, diag = model(x_start.to(device, non_blocking=True), labels.to(device, non_blocking=True),
                                   None if mask is None else mask.to(device, non_blocking=True))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(trainable, 1.0)
            optimizer.step()
            scheduler.step()
            if ema is not None:
                ema.update_parameters(parts)
            step += 1
            count += 1
            for key, value in diag.items():
                sums[key] = sums.get(key, 0) + value.detach()
            if count % 20 == 1:
                bar.set_postfix(l1=f"{float(diag['l1']):.3f}", l2=f"{float(diag['l2']):.3f}")
            if step >= total_steps:
                break
        elapsed += time.perf_counter() - t0
        means = {k: (v.cpu() / max(count, 1)).tolist() for k, v in sums.items()}
        record: dict[str, Any] = {"epoch": epoch + 1, "step": step, **means}
        if dist_info.is_main:
            validated = ema.module if ema is not None else parts
            director = family.director(view, validated.kernel, validated.readout)
            torch.manual_seed(cfg.seed)
            record.update({f"val_{k}": v for k, v in
                           validate(director, data.val.head(dcfg.val_images), dcfg.val_samples, device).items()})
            if best is None or not dcfg.keep_best or record["val_nll"] < best["val_nll"]:
                best = {"epoch": epoch + 1, "val_nll": record["val_nll"],
                        "parts": copy.deepcopy(validated.state_dict())}
            history.append(record)
            print(f"distil epoch {epoch + 1}: L1 {means['l1']:.4f} L2 {means['l2']:.4f} "
                  f"val acc {record['val_accuracy']:.4f} ece {record['val_ece']:.4f} nll {record['val_nll']:.4f} "
                  f"(kept: epoch {best['epoch']}) | per step var_obs {_fmt(means['var_obs'])} "
                  f"mse {_fmt(means['mean_sq_error'])} var_p {_fmt(means['var_p'])} ({elapsed / 60:.1f} min)")
            save_checkpoint(ckpt_path, {
                "parts": parts.state_dict(), "ema": ema.state_dict() if ema is not None else None,
                "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "epoch": epoch + 1,
                "step": step, "history": history, "elapsed": elapsed, "best": best, "tau": teacher.tau,
                "tau_accuracies": teacher.tau_accuracies, "stats": vars(teacher.stats), "config": config_dict(cfg),
            })
    if dist_info.is_main:
        kept = Trainables(copy.deepcopy(kernel), copy.deepcopy(readout))
        if best is not None:
            kept.load_state_dict(best["parts"])
        save_checkpoint(final_path, {
            "kernel": kept.kernel.state_dict(), "kernel_args": kernel_args,
            "readout": kept.readout.state_dict() if dcfg.finetune_readout else None,
            "depth": depth, "backbone_steps": view.num_steps, "kept_epoch": None if best is None else best["epoch"],
            "tau": teacher.tau, "tau_accuracies": teacher.tau_accuracies, "floors": teacher.floors,
            "stats": vars(teacher.stats), "observed_variance": dcfg.observed_variance, "history": history,
            "seconds": elapsed, "config": config_dict(cfg),
        })
    if dist_info.world_size > 1:
        dist.barrier()
        dist.destroy_process_group()
    return DistilResult(final_path, kernel)


def _fmt(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:.2e}" for v in values) + "]"
