"""Stage 2: distil the frozen backbone into one time-conditioned DiT kernel (DESIGN.md section 2).

Runs unchanged under ``torchrun`` (DDP, gloo on CPU / nccl on GPU): each rank takes a disjoint shard of
every epoch's batches; rank 0 validates and writes checkpoints.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from models.director import ImageDirector, StochasticRollout
from models.kernel import TransitionKernel
from models.vit_view import VitTransitionView
from training.config import PipelineConfig, config_dict
from training.data import Split, batches, load_dataset
from training.fit_backbone import load_backbone
from training.metrics import classification_report
from training.objective import DistillationLoss, LossWeights, ObservedProcess
from training.predict import chunked, sampled_logits
from training.runtime import (
    init_distributed,
    load_checkpoint,
    save_checkpoint,
    seed_everything,
    select_device,
    set_threads,
    warmup_cosine,
)

DIRECTOR_FILE = "director.pt"


@dataclass
class StepStatistics:
    """Per-step statistics of the observed process, gathered once before training (all [T])."""

    mean_square: torch.Tensor  # mean(X_t^2)
    raw_var_mean: torch.Tensor  # mean attention mixture variance
    raw_var_max: torch.Tensor  # max attention mixture variance

    def floors(self, fraction: float) -> torch.Tensor:
        return fraction * self.mean_square


@torch.no_grad()
def gather_step_statistics(view: VitTransitionView, images: torch.Tensor, device: torch.device,
                           batch_size: int = 128) -> StepStatistics:
    sums = torch.zeros(view.num_steps)
    var_sums = torch.zeros(view.num_steps)
    var_max = torch.zeros(view.num_steps)
    count = 0
    for start in range(0, images.shape[0], batch_size):
        x = view.embed(images[start : start + batch_size].to(device))
        for t in range(1, view.num_steps + 1):
            x, var = view.transition(t, x)
            sums[t - 1] += float(x.float().square().mean()) * x.shape[0]
            var_sums[t - 1] += float(var.mean()) * x.shape[0]
            var_max[t - 1] = max(float(var_max[t - 1]), float(var.max()))
        count += x.shape[0]
    return StepStatistics(sums / count, var_sums / count, var_max)


@torch.no_grad()
def select_tau(view: VitTransitionView, floors: torch.Tensor, split: Split, grid: list[float], tolerance: float,
               device: torch.device, seed: int) -> tuple[float, dict[str, float]]:
    """Largest tau whose S=1 sampled observed process keeps validation accuracy within ``tolerance`` of
    the backbone's (DESIGN.md section 2)."""
    images, labels = split.images, split.labels
    deterministic = ObservedProcess(view, floors, 0.0, "attention")  # its trajectory is the backbone's own
    base = classification_report(chunked(
        lambda x: view.readout(deterministic.trajectory(view.embed(x.to(device)))[0][-1]).cpu(), images, 256
    ).softmax(-1), labels)
    accuracies = {"backbone": base["accuracy"]}
    chosen = min(grid)
    for tau in sorted(grid, reverse=True):
        torch.manual_seed(seed)
        process = ObservedProcess(view, floors, tau, "attention")
        logits = chunked(lambda x, p=process: view.readout(p.sample(view.embed(x.to(device)))).cpu(), images, 256)
        accuracies[str(tau)] = float((logits.argmax(-1) == labels).float().mean())
        if accuracies[str(tau)] >= base["accuracy"] - tolerance:
            chosen = tau
            break
    return chosen, accuracies


def build_kernel(cfg: PipelineConfig, view: VitTransitionView, floors: torch.Tensor, tau: float,
                 stats: StepStatistics) -> TransitionKernel:
    """Kernel whose initial variance is the mean observed level and whose log-variance is bounded by
    [log floor_t, log(4 max var_obs_t)]."""
    if cfg.distil.observed_variance == "floor":
        var_obs_mean, var_obs_max = floors, floors
    else:
        var_obs_mean, var_obs_max = tau * stats.raw_var_mean + floors, tau * stats.raw_var_max + floors
    return TransitionKernel(
        dim=view.dim, num_heads=view.num_heads, num_steps=view.num_steps, mlp_ratio=cfg.distil.kernel.mlp_ratio,
        logvar_init=math.log(float(var_obs_mean.mean())), logvar_min=floors.log(),
        logvar_max=(4.0 * var_obs_max).log(), frequency_embedding_size=cfg.distil.kernel.frequency_embedding_size,
    )


def director_from_parts(view: VitTransitionView, kernel: TransitionKernel, readout: torch.nn.Module | None = None
                        ) -> ImageDirector:
    return ImageDirector(view.embedding, StochasticRollout(kernel), readout or view.readout_head)


@torch.no_grad()
def validate(model: ImageDirector, split: Split, n_samples: int, device: torch.device) -> dict[str, float]:
    model.eval()
    logits = sampled_logits(lambda x, s: model(x.to(device), s).cpu(), split.images, n_samples)  # [S, N, C]
    return classification_report(logits.softmax(-1).mean(0), split.labels)


def load_director(run_dir: str | Path, device: torch.device | str = "cpu") -> tuple[ImageDirector, dict]:
    """The distilled DIRECTOR module of a run (eager, eval mode) and its saved payload."""
    payload = load_checkpoint(Path(run_dir) / DIRECTOR_FILE)
    view = VitTransitionView(load_backbone(run_dir, device))
    kernel = TransitionKernel(**payload["kernel_args"])
    kernel.load_state_dict(payload["kernel"])
    readout = view.readout_head
    if payload.get("readout") is not None:
        readout = copy.deepcopy(readout)
        readout.load_state_dict(payload["readout"])
    return director_from_parts(view, kernel.to(device), readout).eval(), payload


@dataclass
class DistilResult:
    path: Path
    kernel: TransitionKernel  # this rank's kernel (equal on every rank after DDP training)


def distil(cfg: PipelineConfig, resume: bool = True) -> DistilResult:
    dist_info = init_distributed()
    run_dir = Path(cfg.run_dir)
    ckpt_path, final_path = run_dir / "director_ckpt.pt", run_dir / DIRECTOR_FILE
    set_threads(cfg.threads)
    seed_everything(cfg.seed)
    device = select_device(cfg.device, dist_info)
    dcfg = cfg.distil
    data = load_dataset(cfg.data.dataset, cfg.data.root, cfg.data.val_size, cfg.data.split_seed,
                        cfg.data.train_limit, cfg.data.test_limit)
    if not (run_dir / "backbone.pt").exists():
        raise FileNotFoundError(f"no fitted backbone in {run_dir}: run `python -m training fit-backbone` first")
    view = VitTransitionView(load_backbone(run_dir, device))  # frozen, eval()

    state = load_checkpoint(ckpt_path) if resume and ckpt_path.exists() else None
    t_start = time.perf_counter()
    if state is None:
        stats = gather_step_statistics(view, data.train.images[: dcfg.stats_batches * 128], device)
        floors = stats.floors(dcfg.floor_fraction)
        if dcfg.observed_variance == "floor":
            tau, tau_accuracies = 0.0, {}
        elif dcfg.tau is not None:
            tau, tau_accuracies = dcfg.tau, {}
        else:
            tau, tau_accuracies = select_tau(view, floors, data.val.head(dcfg.tau_images), dcfg.tau_grid,
                                             dcfg.tau_tolerance, device, cfg.seed)
        if dist_info.is_main:
            print(f"observed variance: {dcfg.observed_variance}, tau={tau} (S=1 val accuracy {tau_accuracies})")
    else:
        stats = StepStatistics(**state["stats"])
        floors, tau, tau_accuracies = stats.floors(dcfg.floor_fraction), state["tau"], state["tau_accuracies"]
        print(f"resuming distillation at epoch {state['epoch']}")

    kernel = build_kernel(cfg, view, floors, tau, stats).to(device)
    kernel_args = {"dim": kernel.dim, "num_heads": view.num_heads, "num_steps": view.num_steps,
                   "mlp_ratio": dcfg.kernel.mlp_ratio, "frequency_embedding_size": dcfg.kernel.frequency_embedding_size,
                   "logvar_init": float(kernel.var_head.bias.detach()[0]), "logvar_min": kernel.logvar_min.cpu(),
                   "logvar_max": kernel.logvar_max.cpu()}
    readout = view.readout_head
    if dcfg.finetune_readout:
        readout = copy.deepcopy(readout).requires_grad_(True)
    process = ObservedProcess(view, floors, tau, dcfg.observed_variance)
    weights = LossWeights(dcfg.lambda_1, dcfg.lambda_2, dcfg.beta_nll, dcfg.mean_mse_weight, dcfg.l1_on_rollout,
                          dcfg.train_samples)
    objective = DistillationLoss(kernel, readout, process, weights).to(device)
    trainable = [p for p in objective.parameters() if p.requires_grad]
    model: torch.nn.Module = objective
    if dist_info.world_size > 1:
        model = DistributedDataParallel(objective)
    optimizer = torch.optim.AdamW(trainable, lr=dcfg.lr, weight_decay=dcfg.weight_decay)
    steps_per_epoch = -(-len(data.train) // (dcfg.batch_size * dist_info.world_size))
    total_steps = steps_per_epoch * dcfg.epochs
    if dcfg.max_steps is not None:
        total_steps = min(total_steps, dcfg.max_steps)
    scheduler = warmup_cosine(optimizer, dcfg.warmup_steps, total_steps)
    start_epoch, step, history, elapsed = 0, 0, [], 0.0
    if state is not None:
        kernel.load_state_dict(state["kernel"])
        if state.get("readout") is not None:
            readout.load_state_dict(state["readout"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        start_epoch, step, history, elapsed = state["epoch"], state["step"], state["history"], state["elapsed"]
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
        bar = tqdm(batches(data.train, dcfg.batch_size, True, gen, dist_info.rank, dist_info.world_size),
                   total=steps_per_epoch, desc=f"distil epoch {epoch + 1}/{dcfg.epochs}", leave=False,
                   disable=not dist_info.is_main)
        for images, labels in bar:
            with torch.no_grad():
                x0 = view.embed(images.to(device))  # [B, N, D]
            loss, diag = model(x0, labels.to(device))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(trainable, 1.0)
            optimizer.step()
            scheduler.step()
            step += 1
            count += 1
            for key, value in diag.items():
                sums[key] = sums.get(key, 0) + value.cpu()
            bar.set_postfix(l1=f"{float(diag['l1']):.3f}", l2=f"{float(diag['l2']):.3f}")
            if step >= total_steps:
                break
        elapsed += time.perf_counter() - t0
        means = {k: (v / max(count, 1)).tolist() for k, v in sums.items()}
        record = {"epoch": epoch + 1, "step": step, **means}
        if dist_info.is_main:
            director = director_from_parts(view, kernel, readout)
            torch.manual_seed(cfg.seed)
            record.update({f"val_{k}": v for k, v in
                           validate(director, data.val.head(dcfg.val_images), dcfg.val_samples, device).items()})
            history.append(record)
            print(f"distil epoch {epoch + 1}: L1 {means['l1']:.4f} L2 {means['l2']:.4f} "
                  f"val acc {record['val_accuracy']:.4f} ece {record['val_ece']:.4f} nll {record['val_nll']:.4f} "
                  f"| per step var_obs {_fmt(means['var_obs'])} mse {_fmt(means['mean_sq_error'])} "
                  f"var_p {_fmt(means['var_p'])} ({elapsed / 60:.1f} min)")
            save_checkpoint(ckpt_path, {
                "kernel": kernel.state_dict(), "readout": readout.state_dict() if dcfg.finetune_readout else None,
                "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "epoch": epoch + 1,
                "step": step, "history": history, "elapsed": elapsed, "tau": tau, "tau_accuracies": tau_accuracies,
                "stats": vars(stats), "config": config_dict(cfg),
            })
    if dist_info.is_main:
        save_checkpoint(final_path, {
            "kernel": kernel.state_dict(), "kernel_args": kernel_args,
            "readout": readout.state_dict() if dcfg.finetune_readout else None,
            "tau": tau, "tau_accuracies": tau_accuracies, "floors": floors, "stats": vars(stats),
            "observed_variance": dcfg.observed_variance, "history": history, "seconds": elapsed,
            "config": config_dict(cfg),
        })
    if dist_info.world_size > 1:
        dist.barrier()
        dist.destroy_process_group()
    return DistilResult(final_path, kernel)


def _fmt(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:.2e}" for v in values) + "]"
