"""Stage 1: fit the backbone classifier (AdamW, warm-up + cosine, checkpoints every epoch, resumable).

Image (``modality: image``): train a ViT from scratch (augmentation, dropout for MC dropout). Text (``modality:
text``): fine-tune pretrained MiniLM-L6 (or a tiny random BERT in tests) with a classification head on the
movie-review sentences; the run's tokenizer is written to ``<run_dir>/tokenizer.json`` first and used by every
later stage. A user's pretrained checkpoint (``pretrained.source``) is converted, and only a missing head is fitted
(``training.fit.pretrained``). One training loop serves all of them; ``FitTask`` is what each contributes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm import tqdm

from models.backbones import build_vit
from training.config import PipelineConfig, config_dict
from training.data.image_task import load_image_dataset
from training.data.images import augment, batches
from training.fit.pretrained import pretrained_fit_task
from training.fit.task import Batch, FitTask, evaluate_backbone
from training.loading import BACKBONE_FILE
from training.runtime import (
    autocast,
    load_checkpoint,
    save_checkpoint,
    seed_everything,
    select_device,
    set_threads,
    warmup_cosine,
)

LOG_EVERY = 20  # steps between progress-bar updates, the only host reads of the loss inside an epoch
CHECKPOINT_FILE = "backbone_ckpt.pt"  # the fit's progress, one save per epoch: a resumed fit starts from it


def image_fit_task(cfg: PipelineConfig, device: torch.device, resume: bool) -> FitTask:
    del resume  # the loop's checkpoint is all an image run resumes from
    data = load_image_dataset(cfg)
    model = build_vit(cfg.backbone).to(device)
    splits = {"val": data.val, "test": data.test}

    def train_batches(gen: torch.Generator) -> Iterator[Batch]:
        for images, labels in batches(data.train, cfg.fit.batch_size, shuffle=True, generator=gen):
            if cfg.fit.augment:
                images = augment(images, gen)
            yield (images,), labels

    def evaluate(fitted: nn.Module, name: str) -> dict[str, float]:
        return evaluate_backbone(fitted, splits[name], device)

    return FitTask(model, len(data.train), train_batches, evaluate,
                   {"backbone_config": config_dict(cfg)["backbone"], "labels": data.labels})


def text_fit_task(cfg: PipelineConfig, device: torch.device, resume: bool) -> FitTask:
    from training.data.tokens import (
        TOKENIZER_FILE,
        build_tokenizer,
        load_run_tokenizer,
        raw_text_task,
        token_batches,
        tokenize_dataset,
    )
    from training.families.text_models import build_text_classifier, text_backbone_payload

    run_dir = Path(cfg.run_dir)
    raw = raw_text_task(cfg)
    if resume and (run_dir / TOKENIZER_FILE).exists():
        tokenizer = load_run_tokenizer(run_dir)
    else:
        tokenizer = build_tokenizer(cfg.text, raw[0].texts)
        run_dir.mkdir(parents=True, exist_ok=True)
        tokenizer.save(str(run_dir / TOKENIZER_FILE))
    data = tokenize_dataset(tokenizer, cfg.text, raw)
    model = build_text_classifier(cfg.text, len(data.labels), tokenizer.get_vocab_size()).to(device)
    splits = {"val": data.val, "test": data.test}

    def train_batches(gen: torch.Generator) -> Iterator[Batch]:
        yield from token_batches(data.train, cfg.fit.batch_size, True, gen, bucket=cfg.text.bucket)

    def evaluate(fitted: nn.Module, name: str) -> dict[str, float]:
        return evaluate_backbone(fitted, splits[name], device, chunk=256)

    return FitTask(model, len(data.train), train_batches, evaluate,
                   {"modality": "text", "text_backbone": text_backbone_payload(model), "labels": data.labels,
                    "tokenizer": TOKENIZER_FILE})


FitTaskBuilder = Callable[[PipelineConfig, torch.device, bool], FitTask]  # (config, device, resume)
FIT_TASKS: dict[str, FitTaskBuilder] = {"image": image_fit_task, "text": text_fit_task}


@dataclass
class Fitting:
    """One backbone fit: the task, its optimiser and schedule, and where training stands (what a checkpoint saves
    and a resumed fit starts from)."""

    cfg: PipelineConfig
    device: torch.device
    task: FitTask
    trainable: list[nn.Parameter]
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    steps_per_epoch: int
    epochs: int
    total_steps: int
    start_epoch: int = 0
    step: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    elapsed: float = 0.0  # seconds spent training, across resumptions


def prepare(cfg: PipelineConfig, resume: bool, ckpt_path: Path) -> Fitting:
    """The task (a user's checkpoint, else the modality's), AdamW with warm-up and cosine, restored from the
    checkpoint when resuming."""
    set_threads(cfg.threads)
    seed_everything(cfg.seed)
    device = select_device(cfg.device)
    task = (pretrained_fit_task if cfg.pretrained.source is not None else FIT_TASKS[cfg.modality])(cfg, device, resume)
    trainable = [p for p in task.model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=cfg.fit.lr, weight_decay=cfg.fit.weight_decay)
    steps_per_epoch = -(-task.train_size // cfg.fit.batch_size)
    epochs = cfg.fit.epochs if task.epochs is None else task.epochs
    total_steps = steps_per_epoch * epochs
    if cfg.fit.max_steps is not None:
        total_steps = min(total_steps, cfg.fit.max_steps)
    scheduler = warmup_cosine(optimizer, int(cfg.fit.warmup_epochs * steps_per_epoch), total_steps)
    fit = Fitting(cfg, device, task, trainable, optimizer, scheduler, steps_per_epoch, epochs, total_steps)
    if resume and ckpt_path.exists():
        state = load_checkpoint(ckpt_path)
        task.model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        fit.start_epoch, fit.step, fit.history, fit.elapsed = (state["epoch"], state["step"], state["history"],
                                                               state["elapsed"])
        print(f"resuming backbone fit at epoch {fit.start_epoch}")
    return fit


def train_epoch(fit: Fitting, epoch: int, gen: torch.Generator) -> float:
    """One epoch (or what is left of the step budget); the smoothed training loss at its end."""
    cfg, model, device = fit.cfg, fit.task.model, fit.device
    gen.manual_seed(cfg.seed * 1000 + epoch)  # resumable: the epoch alone fixes its order and augmentation
    model.train()
    t0 = time.perf_counter()
    bar = tqdm(fit.task.train_batches(gen), total=fit.steps_per_epoch,
               desc=f"fit-backbone epoch {epoch + 1}/{fit.epochs}", leave=False)
    running = torch.zeros((), device=device)  # smoothed loss, kept on the device: read once per log interval
    for epoch_steps, (inputs, labels) in enumerate(bar, start=1):
        with autocast(device, cfg.bf16):
            logits = model(*(x.to(device, non_blocking=True) for x in inputs))  # [B, C]
        loss = cfg.task.task().loss(logits, labels.to(device, non_blocking=True), cfg.fit.label_smoothing)
        fit.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.fit.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(fit.trainable, cfg.fit.grad_clip)
        fit.optimizer.step()
        fit.scheduler.step()
        fit.step += 1
        running = loss.detach() if epoch_steps == 1 else 0.98 * running + 0.02 * loss.detach()
        if epoch_steps % LOG_EVERY == 1:
            bar.set_postfix(loss=f"{float(running):.3f}", lr=f"{fit.scheduler.get_last_lr()[0]:.2e}")
        if fit.step >= fit.total_steps:
            break
    fit.elapsed += time.perf_counter() - t0
    return float(running)


def fit_backbone(cfg: PipelineConfig, resume: bool = True) -> Path:
    """Fit (resumable, one checkpoint per epoch) and write ``backbone.pt`` with the test figures beside it."""
    run_dir = Path(cfg.run_dir)
    final_path = run_dir / BACKBONE_FILE
    ckpt_path = run_dir / CHECKPOINT_FILE
    fit = prepare(cfg, resume, ckpt_path)
    model = fit.task.model
    gen = torch.Generator().manual_seed(cfg.seed)
    for epoch in range(fit.start_epoch, fit.epochs):
        if fit.step >= fit.total_steps:
            break
        train_loss = train_epoch(fit, epoch, gen)
        val = fit.task.evaluate(model, "val")
        fit.history.append({"epoch": epoch + 1, "train_loss": train_loss, **{f"val_{k}": v for k, v in val.items()}})
        print(f"epoch {epoch + 1}: loss {train_loss:.4f} val acc {val['accuracy']:.4f} ece {val['ece']:.4f} "
              f"({fit.elapsed / 60:.1f} min)")
        save_checkpoint(ckpt_path, {"model": model.state_dict(), "optimizer": fit.optimizer.state_dict(),
                                    "scheduler": fit.scheduler.state_dict(), "epoch": epoch + 1, "step": fit.step,
                                    "history": fit.history, "elapsed": fit.elapsed, "config": config_dict(cfg)})
    test = fit.task.evaluate(model, "test")
    print(f"backbone test: {test}")
    save_checkpoint(final_path, {
        "state_dict": model.state_dict(), "config": config_dict(cfg), "history": fit.history, "test": test,
        "seconds": fit.elapsed, **fit.task.payload,
    })
    return final_path
