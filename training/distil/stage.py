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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from tqdm import tqdm

from models.kernel import KernelConfig, TransitionKernel
from models.tasks import SOFTMAX, Task
from training.config import PipelineConfig, config_dict
from training.data.images import Dataset
from training.data.tokens import TokenDataset, bucketed_indices
from training.distil.objective import DistillationLoss, LossWeights, ObservedProcess
from training.distil.start_states import StartStates, start_states
from training.distil.teacher import (
    STATISTICS_FILE,
    StepStatistics,
    diffused_depth,
    gather_step_statistics,
    kernel_config,
    select_tau,
    shared_statistics,
    statistics_key,
)
from training.families.base import Family
from training.loading import (
    BACKBONE_FILE,
    DIRECTOR_FILE,
    AnySplit,
    Director,
    RunBackbone,
    View,
    load_data,
    split_sampled_logits,
)
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
from training.tasks import logits_report

CHECKPOINT_FILE = "director_ckpt.pt"


@torch.no_grad()
def validate(model: Director, split: AnySplit, n_samples: int, device: torch.device, task: Task = SOFTMAX
             ) -> dict[str, float]:
    model.eval()
    logits = split_sampled_logits(model, split, n_samples, device)  # [S, N, C]
    return logits_report(task, logits, split.labels)


@dataclass
class Teacher:
    """What distillation fixes before the first step: statistics of all T steps, K, floors and tau."""

    stats: StepStatistics  # all T transitions
    depth: int  # K, the diffused transitions
    floors: torch.Tensor  # [K]
    tau: float
    tau_accuracies: dict[str, float]


def prepare_teacher(cfg: PipelineConfig, family: Family, view: View, prefix: torch.nn.Module, depth: int, data: Any,
                    device: torch.device, state: dict[str, Any] | None, verbose: bool) -> Teacher:
    """Gather the step statistics and select tau, or take both from a checkpoint being resumed."""
    dcfg = cfg.distil
    if state is not None:
        stats = StepStatistics(**state["stats"])
        return Teacher(stats, depth, stats.last(depth).floors(dcfg.floor_fraction), state["tau"],
                       state["tau_accuracies"])
    inputs = data.train.head(dcfg.stats_batches * 128)
    stats = shared_statistics(Path(cfg.run_dir) / STATISTICS_FILE,
                              statistics_key(Path(cfg.run_dir) / BACKBONE_FILE, len(inputs)),
                              lambda: gather_step_statistics(view, inputs, device, family.stats_chunk))
    floors = stats.last(depth).floors(dcfg.floor_fraction)
    if dcfg.observed_variance == "floor":
        tau, tau_accuracies = 0.0, {}
    elif dcfg.tau is not None:
        tau, tau_accuracies = dcfg.tau, {}
    else:
        tau, tau_accuracies = select_tau(view, prefix, floors, data.val.head(dcfg.tau_images), dcfg.tau_grid,
                                         dcfg.tau_tolerance, device, cfg.seed, cfg.task.task())
    if verbose:
        print(f"K={depth} (the last {depth} of {view.num_steps} transitions diffused); observed variance: "
              f"{dcfg.observed_variance}, tau={tau} "
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
    run: Distillation  # what ``distil(..., run=)`` goes on with


@dataclass
class Progress:
    """Where training stands: what a checkpoint saves and a resumed run starts from."""

    epoch: int = 0
    step: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    elapsed: float = 0.0  # seconds spent, across resumptions
    best: dict[str, Any] | None = None  # the kept epoch: its number, validation NLL and trained weights


@dataclass
class Distillation:
    """Everything one distillation run holds: the frozen teacher, the trained parts, their objective, optimiser,
    schedule and moving average, and the start states X_{T-K} of every training input."""

    cfg: PipelineConfig
    dist_info: DistInfo
    device: torch.device
    family: Family
    view: View
    data: Any
    teacher: Teacher
    parts: Trainables
    kernel_config: KernelConfig  # what rebuilds the kernel from its saved weights
    objective: DistillationLoss
    model: torch.nn.Module  # the objective, wrapped for DDP when there are several ranks
    trainable: list[torch.nn.Parameter]
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    ema: AveragedModel | None
    starts: StartStates
    steps_per_epoch: int
    total_steps: int
    progress: Progress


def distil(cfg: PipelineConfig, resume: bool = True, until: int | None = None, run: Distillation | None = None
           ) -> DistilResult:
    """Train the kernel (resumable, one checkpoint per epoch) to ``distil.epochs``, or to epoch ``until`` (a depth
    search's probe: the schedule still spans every epoch, so going on later trains the run it would have been); write
    ``director.pt`` with the kept weights. ``run``: a prepared run to go on with (its start states in memory)."""
    run = run or prepare(cfg, resume)
    last = cfg.distil.epochs if until is None else min(until, cfg.distil.epochs)
    gen = torch.Generator().manual_seed(cfg.seed)
    for epoch in range(run.progress.epoch, last):
        if run.progress.step >= run.total_steps:
            break
        record = train_epoch(run, epoch, gen)
        if run.dist_info.is_main:
            validate_and_keep(run, record)
            save_progress(run)
    path = Path(cfg.run_dir) / DIRECTOR_FILE
    if run.dist_info.is_main:
        save_kept(run, path)
    if run.dist_info.world_size > 1:
        dist.barrier()
        dist.destroy_process_group()
    return DistilResult(path, run.parts.kernel, run)


def prepare(cfg: PipelineConfig, resume: bool) -> Distillation:
    """The teacher, the kernel sized to its observed variance, the objective and optimiser (restored from the
    checkpoint when resuming) and the start states of every training input, computed once."""
    dist_info = init_distributed(cfg.device)
    run_dir = Path(cfg.run_dir)
    ckpt_path = run_dir / CHECKPOINT_FILE
    set_threads(cfg.threads)
    seed_everything(cfg.seed)
    device = select_device(cfg.device, dist_info)
    dcfg = cfg.distil
    if not (run_dir / BACKBONE_FILE).exists():
        raise FileNotFoundError(f"no fitted backbone in {run_dir}: run `python -m training fit-backbone` first")
    data = load_data(cfg)
    opened = RunBackbone.open(run_dir, device)  # backbone.pt read once
    family, view = opened.family, opened.family.view(opened.backbone)  # frozen, eval()
    depth = diffused_depth(cfg, view)
    prefix = view.prefix(view.num_steps - depth).to(device).eval()
    state = load_checkpoint(ckpt_path) if resume and ckpt_path.exists() else None
    t_start = time.perf_counter()
    teacher = prepare_teacher(cfg, family, view, prefix, depth, data, device, state, dist_info.is_main)
    if state is not None:
        print(f"resuming distillation at epoch {state['epoch']}")
    config = kernel_config(cfg, view, teacher.floors, teacher.tau, teacher.stats.last(depth), family.causal)
    kernel = TransitionKernel.from_config(config).to(device)
    readout = family.default_readout(view)
    if dcfg.finetune_readout:
        readout = copy.deepcopy(readout).requires_grad_(True)
    parts = Trainables(kernel, readout)
    process = ObservedProcess(view, teacher.floors, teacher.tau, dcfg.observed_variance, view.num_steps - depth)
    weights = LossWeights(dcfg.lambda_1, dcfg.lambda_2, dcfg.beta_nll, dcfg.mean_mse_weight, dcfg.l1_on_rollout,
                          dcfg.train_samples, dcfg.l2_target)
    objective = DistillationLoss(kernel, readout, process, weights, cfg.task.task()).to(device)
    trainable = [p for p in objective.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=dcfg.lr, weight_decay=dcfg.weight_decay)
    unlabeled = unlabeled_inputs(cfg, family, data)  # the teacher's targets only
    inputs = len(data.train) + (len(unlabeled) if unlabeled is not None else 0)
    steps_per_epoch = -(-inputs // (dcfg.batch_size * dist_info.world_size))
    total_steps = steps_per_epoch * dcfg.epochs
    if dcfg.max_steps is not None:
        total_steps = min(total_steps, dcfg.max_steps)
    scheduler = warmup_cosine(optimizer, dcfg.warmup_steps, total_steps)
    ema = moving_average(parts, dcfg.ema_decay)
    progress = Progress()
    if state is not None:
        parts.load_state_dict(state["parts"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        if ema is not None:
            ema.load_state_dict(state["ema"])
        progress = Progress(state["epoch"], state["step"], state["history"], state["elapsed"], state["best"])
    inputs_to_diffuse = [data.train] if unlabeled is None else [data.train, unlabeled]
    starts = start_states(view, prefix, inputs_to_diffuse, device, dcfg.start_states_memory_bytes,
                          run_dir / f"rank-{dist_info.rank}")  # X_{T-K} of every training input, once
    progress.elapsed += time.perf_counter() - t_start
    return Distillation(cfg, dist_info, device, family, view, data, teacher, parts, config, objective,
                        data_parallel(objective, device, dist_info), trainable, optimizer, scheduler, ema, starts,
                        steps_per_epoch, total_steps, progress)


def train_epoch(run: Distillation, epoch: int, gen: torch.Generator) -> dict[str, Any]:
    """One epoch of the K diffused steps on this rank's shard; the epoch's mean diagnostics."""
    cfg, dcfg, progress = run.cfg, run.cfg.distil, run.progress
    gen.manual_seed(cfg.seed * 1000 + epoch)
    torch.manual_seed(cfg.seed * 1000 + epoch + 7919 * run.dist_info.rank)
    t0 = time.perf_counter()
    run.objective.train()
    run.parts.readout.train(dcfg.finetune_readout)
    sums: dict[str, torch.Tensor] = {}
    count = 0
    bar = tqdm(epoch_batches(cfg, run.starts, gen, run.dist_info), total=run.steps_per_epoch,
               desc=f"distil epoch {epoch + 1}/{dcfg.epochs}", leave=False, disable=not run.dist_info.is_main)
    for x_start, mask, labels in bar:
        with autocast(run.device, cfg.bf16):
            loss, diag = run.model(x_start.to(run.device, non_blocking=True),
                                   labels.to(run.device, non_blocking=True),
                                   None if mask is None else mask.to(run.device, non_blocking=True))
        run.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(run.trainable, 1.0)
        run.optimizer.step()
        run.scheduler.step()
        if run.ema is not None:
            run.ema.update_parameters(run.parts)
        progress.step += 1
        count += 1
        for key, value in diag.items():
            sums[key] = sums.get(key, 0) + value.detach()
        if count % 20 == 1:
            bar.set_postfix(l1=f"{float(diag['l1']):.3f}", l2=f"{float(diag['l2']):.3f}")
        if progress.step >= run.total_steps:
            break
    progress.elapsed += time.perf_counter() - t0
    progress.epoch = epoch + 1
    means = {k: (v.cpu() / max(count, 1)).tolist() for k, v in sums.items()}
    return {"epoch": epoch + 1, "step": progress.step, **means}


def validate_and_keep(run: Distillation, record: dict[str, Any]) -> None:
    """Validate the moving average (else the trained weights) and keep them when their NLL is the best so far."""
    cfg, dcfg, progress = run.cfg, run.cfg.distil, run.progress
    validated = run.ema.module if run.ema is not None else run.parts
    director = run.family.director(run.view, validated.kernel, validated.readout)
    torch.manual_seed(cfg.seed)
    report = validate(director, run.data.val.head(dcfg.val_images), dcfg.val_samples, run.device, cfg.task.task())
    record.update({f"val_{k}": v for k, v in report.items()})
    best = progress.best
    if best is None or not dcfg.keep_best or record["val_nll"] < best["val_nll"]:
        progress.best = best = {"epoch": record["epoch"], "val_nll": record["val_nll"],
                                "parts": copy.deepcopy(validated.state_dict())}
    progress.history.append(record)
    print(f"distil epoch {record['epoch']}: L1 {record['l1']:.4f} L2 {record['l2']:.4f} "
          f"val acc {record['val_accuracy']:.4f} ece {record['val_ece']:.4f} nll {record['val_nll']:.4f} "
          f"(kept: epoch {best['epoch']}) | per step var_obs {_fmt(record['var_obs'])} "
          f"mse {_fmt(record['mean_sq_error'])} var_p {_fmt(record['var_p'])} ({progress.elapsed / 60:.1f} min)")


def save_progress(run: Distillation) -> None:
    """The epoch's checkpoint: everything ``prepare`` restores to resume."""
    progress, teacher = run.progress, run.teacher
    save_checkpoint(Path(run.cfg.run_dir) / CHECKPOINT_FILE, {
        "parts": run.parts.state_dict(), "ema": run.ema.state_dict() if run.ema is not None else None,
        "optimizer": run.optimizer.state_dict(), "scheduler": run.scheduler.state_dict(), "epoch": progress.epoch,
        "step": progress.step, "history": progress.history, "elapsed": progress.elapsed, "best": progress.best,
        "tau": teacher.tau, "tau_accuracies": teacher.tau_accuracies, "stats": vars(teacher.stats),
        "config": config_dict(run.cfg),
    })


def save_kept(run: Distillation, path: Path) -> None:
    """``director.pt``: the kept epoch's weights with what the exporter needs beside them."""
    dcfg, teacher, best = run.cfg.distil, run.teacher, run.progress.best
    kept = Trainables(copy.deepcopy(run.parts.kernel), copy.deepcopy(run.parts.readout))
    if best is not None:
        kept.load_state_dict(best["parts"])
    save_checkpoint(path, {
        "kernel": kept.kernel.state_dict(), "kernel_config": run.kernel_config.document(),
        "readout": kept.readout.state_dict() if dcfg.finetune_readout else None,
        "depth": run.kernel_config.depth, "backbone_steps": run.view.num_steps,
        "kept_epoch": None if best is None else best["epoch"], "epochs_trained": run.progress.epoch,
        "finished": run.progress.epoch >= dcfg.epochs or run.progress.step >= run.total_steps, "tau": teacher.tau,
        "tau_accuracies": teacher.tau_accuracies, "floors": teacher.floors, "stats": vars(teacher.stats),
        "observed_variance": dcfg.observed_variance, "history": run.progress.history,
        "seconds": run.progress.elapsed, "config": config_dict(run.cfg),
    })


def _fmt(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:.2e}" for v in values) + "]"
