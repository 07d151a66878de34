"""Stage 2: distil the frozen backbone into one time-conditioned DiT kernel (DESIGN.md section 2).

Runs unchanged under ``torchrun`` (DDP, gloo on CPU / nccl on GPU): each rank takes a disjoint shard of
every epoch's batches; rank 0 validates and writes checkpoints.

One loop for both modalities. Image splits (``training.data.Split``) carry pixels; text splits
(``training.text_inputs.TokenSplit``) carry token ids and an attention mask, which becomes the key padding mask of
the teacher's attention, the kernel's attention, the KL and the readout's pooling; the step statistics are means
over real tokens. The text DIRECTOR is built from plain modules copied from the view (``models.text_director``).
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from models.bert_view import BertTransitionView
from models.director import ImageDirector, StochasticRollout
from models.kernel import TransitionKernel
from models.text_backbones import TextClassifier
from models.text_director import TextDirector, TextReadout, text_director_from_view
from models.vit_view import VitTransitionView
from training.config import PipelineConfig, config_dict
from training.data import Dataset, Split, batches, load_dataset
from training.fit_backbone import load_backbone
from training.metrics import classification_report
from training.objective import DistillationLoss, LossWeights, ObservedProcess, masked_mean
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
from training.text_inputs import (
    TokenDataset,
    TokenSplit,
    load_run_tokenizer,
    raw_text_task,
    text_outputs,
    text_sampled_logits,
    token_batches,
    tokenize_dataset,
)

DIRECTOR_FILE = "director.pt"
TEXT_CHUNK = 64  # texts per teacher forward: the fp64 mixture variance is [B, H, L, D]
View = VitTransitionView | BertTransitionView
Director = ImageDirector | TextDirector
AnySplit = Split | TokenSplit


def load_data(cfg: PipelineConfig) -> Dataset | TokenDataset:
    """The run's dataset: images, or texts tokenised with the run's own tokenizer (written by fit-backbone)."""
    if cfg.is_text:
        raw = raw_text_task(cfg)
        return tokenize_dataset(load_run_tokenizer(cfg.run_dir), cfg.text, raw)
    return load_dataset(cfg.data.dataset, cfg.data.root, cfg.data.val_size, cfg.data.split_seed,
                        cfg.data.train_limit, cfg.data.test_limit)


def load_view(run_dir: str | Path, device: torch.device | str = "cpu") -> View:
    """The frozen transition view of a run's fitted backbone (eval mode)."""
    backbone = load_backbone(run_dir, device)
    return BertTransitionView(backbone) if isinstance(backbone, TextClassifier) else VitTransitionView(backbone)


def read_out(view: View, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """The view's readout of X_T [B, N, D] (pooling over real tokens when ``mask`` [B, N] is given) -> [B, C]."""
    return view.readout(x) if mask is None else view.readout(x, mask)


def embedded_chunks(view: View, source: torch.Tensor | TokenSplit, device: torch.device, batch_size: int
                    ) -> Iterator[tuple[torch.Tensor, torch.Tensor | None]]:
    """X_0 [b, N, D] and the key padding mask [b, N] (None for images) of ``source`` in chunks: images in order,
    texts sorted by length (little padding)."""
    if isinstance(source, TokenSplit):
        order = torch.argsort(source.lengths, stable=True)  # [N]
        for start in range(0, len(source), batch_size):
            ids, mask = source.rows(order[start : start + batch_size])
            yield view.embed(ids.to(device), mask.to(device)), mask.to(device).bool()
    else:
        for start in range(0, source.shape[0], batch_size):
            yield view.embed(source[start : start + batch_size].to(device)), None


def view_logits(view: View, split: AnySplit, rollout: Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor],
                device: torch.device) -> torch.Tensor:
    """Readout logits [N, C] of ``rollout(X_0, mask) -> X_T`` over a split, chunked."""
    if isinstance(split, TokenSplit):
        def fn(ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            real = mask.bool()  # [b, L]
            return read_out(view, rollout(view.embed(ids, mask), real), real).float().cpu()

        return text_outputs(fn, split, TEXT_CHUNK, device)
    return chunked(lambda x: view.readout(rollout(view.embed(x.to(device)), None)).cpu(), split.images, 256)


def split_sampled_logits(model: torch.nn.Module, split: AnySplit, n_samples: int,
                         device: torch.device | str = "cpu", rows_per_forward: int = 256) -> torch.Tensor:
    """Sampled logits [S, N, C] of an artifact-contract model on an image or text split, in forwards of about
    ``rows_per_forward`` sample rows."""
    if isinstance(split, TokenSplit):
        return text_sampled_logits(model, split, n_samples, rows_per_forward, device=device)
    return sampled_logits(lambda x, s: model(x.to(device), s).cpu(), split.images, n_samples, rows_per_forward)


@dataclass
class StepStatistics:
    """Per-step statistics of the observed process, gathered once before training (all [T])."""

    mean_square: torch.Tensor  # mean(X_t^2)
    raw_var_mean: torch.Tensor  # mean attention mixture variance
    raw_var_max: torch.Tensor  # max attention mixture variance

    def floors(self, fraction: float) -> torch.Tensor:
        return fraction * self.mean_square


@torch.no_grad()
def gather_step_statistics(view: View, images: torch.Tensor | TokenSplit, device: torch.device,
                           batch_size: int = 128) -> StepStatistics:
    """Per-step statistics of the backbone's own trajectory on ``images`` (or texts: over real tokens only)."""
    sums = torch.zeros(view.num_steps)
    var_sums = torch.zeros(view.num_steps)
    var_max = torch.zeros(view.num_steps)
    count = 0
    for x, mask in embedded_chunks(view, images, device, batch_size):
        if mask is None:
            weight = x.shape[0]
            for t in range(1, view.num_steps + 1):
                x, var = view.transition(t, x)
                sums[t - 1] += float(x.float().square().mean()) * weight
                var_sums[t - 1] += float(var.mean()) * weight
                var_max[t - 1] = max(float(var_max[t - 1]), float(var.max()))
        else:
            weight = int(mask.sum())  # real tokens
            for t in range(1, view.num_steps + 1):
                x, var = view.transition(t, x, mask)
                sums[t - 1] += float(masked_mean(x.float().square(), mask)) * weight
                var_sums[t - 1] += float(masked_mean(var, mask)) * weight
                var_max[t - 1] = max(float(var_max[t - 1]), float(var[mask].max()))
        count += weight
    return StepStatistics(sums / count, var_sums / count, var_max)


@torch.no_grad()
def select_tau(view: View, floors: torch.Tensor, split: AnySplit, grid: list[float], tolerance: float,
               device: torch.device, seed: int) -> tuple[float, dict[str, float]]:
    """Largest tau whose S=1 sampled observed process keeps validation accuracy within ``tolerance`` of
    the backbone's (DESIGN.md section 2)."""
    labels = split.labels
    deterministic = ObservedProcess(view, floors, 0.0, "attention")  # its trajectory is the backbone's own
    base = classification_report(view_logits(
        view, split, lambda x0, mask: deterministic.trajectory(x0, mask)[0][-1], device).softmax(-1), labels)
    accuracies = {"backbone": base["accuracy"]}
    chosen = min(grid)
    for tau in sorted(grid, reverse=True):
        torch.manual_seed(seed)
        process = ObservedProcess(view, floors, tau, "attention")
        logits = view_logits(view, split, process.sample, device)
        accuracies[str(tau)] = float((logits.argmax(-1) == labels).float().mean())
        if accuracies[str(tau)] >= base["accuracy"] - tolerance:
            chosen = tau
            break
    return chosen, accuracies


def build_kernel(cfg: PipelineConfig, view: View, floors: torch.Tensor, tau: float,
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


def default_readout(view: View) -> torch.nn.Module:
    """The readout the kernel is trained with: the view's own (image) or its plain-module copy (text)."""
    return TextReadout.from_bert(view.readout_head) if isinstance(view, BertTransitionView) else view.readout_head


def director_from_parts(view: View, kernel: TransitionKernel, readout: torch.nn.Module | None = None) -> Director:
    if isinstance(view, BertTransitionView):
        assert readout is None or isinstance(readout, TextReadout)
        return text_director_from_view(view, kernel, readout)
    return ImageDirector(view.embedding, StochasticRollout(kernel), readout or view.readout_head)


@torch.no_grad()
def validate(model: Director, split: AnySplit, n_samples: int, device: torch.device) -> dict[str, float]:
    model.eval()
    logits = split_sampled_logits(model, split, n_samples, device)  # [S, N, C]
    return classification_report(logits.softmax(-1).mean(0), split.labels)


def load_director(run_dir: str | Path, device: torch.device | str = "cpu") -> tuple[Director, dict]:
    """The distilled DIRECTOR module of a run (eager, eval mode) and its saved payload."""
    payload = load_checkpoint(Path(run_dir) / DIRECTOR_FILE)
    view = load_view(run_dir, device)
    kernel = TransitionKernel(**payload["kernel_args"])
    kernel.load_state_dict(payload["kernel"])
    readout = default_readout(view)
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
    if not (run_dir / "backbone.pt").exists():
        raise FileNotFoundError(f"no fitted backbone in {run_dir}: run `python -m training fit-backbone` first")
    data = load_data(cfg)
    view = load_view(run_dir, device)  # frozen, eval()
    stats_inputs = (data.train.head(dcfg.stats_batches * 128) if isinstance(data, TokenDataset)
                    else data.train.images[: dcfg.stats_batches * 128])

    state = load_checkpoint(ckpt_path) if resume and ckpt_path.exists() else None
    t_start = time.perf_counter()
    if state is None:
        stats = gather_step_statistics(view, stats_inputs, device, TEXT_CHUNK if cfg.is_text else 128)
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
    readout = default_readout(view)
    if dcfg.finetune_readout:
        readout = copy.deepcopy(readout).requires_grad_(True)
    process = ObservedProcess(view, floors, tau, dcfg.observed_variance)
    weights = LossWeights(dcfg.lambda_1, dcfg.lambda_2, dcfg.beta_nll, dcfg.mean_mse_weight, dcfg.l1_on_rollout,
                          dcfg.train_samples, dcfg.l2_target)
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
        bar = tqdm(train_batches(cfg, data, gen, dist_info.rank, dist_info.world_size),
                   total=steps_per_epoch, desc=f"distil epoch {epoch + 1}/{dcfg.epochs}", leave=False,
                   disable=not dist_info.is_main)
        for inputs, labels in bar:
            inputs = tuple(x.to(device) for x in inputs)
            mask = inputs[1].bool() if len(inputs) > 1 else None  # [B, N] True for real tokens (text)
            with torch.no_grad():
                x0 = view.embed(*inputs)  # [B, N, D]
            loss, diag = model(x0, labels.to(device), mask)
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


def train_batches(cfg: PipelineConfig, data: Dataset | TokenDataset, gen: torch.Generator, rank: int,
                  world_size: int) -> Iterator[tuple[tuple[torch.Tensor, ...], torch.Tensor]]:
    """One epoch of (model inputs, labels): (pixels,) or (input_ids, attention_mask) (length-bucketed)."""
    if isinstance(data, TokenDataset):
        yield from token_batches(data.train, cfg.distil.batch_size, True, gen, rank, world_size, cfg.text.bucket)
    else:
        for images, labels in batches(data.train, cfg.distil.batch_size, True, gen, rank, world_size):
            yield (images,), labels


def _fmt(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:.2e}" for v in values) + "]"
