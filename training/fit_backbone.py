"""Stage 1: train the backbone ViT (augmentation, AdamW, warm-up + cosine, dropout for MC dropout)."""

from __future__ import annotations

import time
from pathlib import Path

import torch
from torch.nn import functional as F
from tqdm import tqdm

from models.backbones import ImageClassifier, VitConfig, build_vit
from training.config import PipelineConfig, config_dict
from training.data import augment, batches, load_dataset
from training.metrics import classification_report
from training.predict import chunked
from training.runtime import (
    load_checkpoint,
    save_checkpoint,
    seed_everything,
    select_device,
    set_threads,
    warmup_cosine,
)

BACKBONE_FILE = "backbone.pt"


def load_backbone(run_dir: str | Path, device: torch.device | str = "cpu") -> ImageClassifier:
    """The fitted backbone of a run, frozen in eval mode."""
    payload = load_checkpoint(Path(run_dir) / BACKBONE_FILE)
    model = build_vit(VitConfig(**payload["backbone_config"]))
    model.load_state_dict(payload["state_dict"])
    return model.to(device).eval().requires_grad_(False)


def evaluate_backbone(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor,
                      device: torch.device) -> dict[str, float]:
    model.eval()
    logits = chunked(lambda x: model(x.to(device)).float().cpu(), images, 512)
    return classification_report(logits.softmax(-1), labels)


def fit_backbone(cfg: PipelineConfig, resume: bool = True) -> Path:
    run_dir = Path(cfg.run_dir)
    final_path = run_dir / BACKBONE_FILE
    ckpt_path = run_dir / "backbone_ckpt.pt"
    set_threads(cfg.threads)
    seed_everything(cfg.seed)
    device = select_device(cfg.device)
    data = load_dataset(cfg.data.dataset, cfg.data.root, cfg.data.val_size, cfg.data.split_seed,
                        cfg.data.train_limit, cfg.data.test_limit)
    model = build_vit(cfg.backbone).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.fit.lr, weight_decay=cfg.fit.weight_decay)
    steps_per_epoch = -(-len(data.train) // cfg.fit.batch_size)
    total_steps = steps_per_epoch * cfg.fit.epochs
    if cfg.fit.max_steps is not None:
        total_steps = min(total_steps, cfg.fit.max_steps)
    scheduler = warmup_cosine(optimizer, int(cfg.fit.warmup_epochs * steps_per_epoch), total_steps)
    start_epoch, step, history, elapsed = 0, 0, [], 0.0
    if resume and ckpt_path.exists():
        state = load_checkpoint(ckpt_path)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        start_epoch, step, history, elapsed = state["epoch"], state["step"], state["history"], state["elapsed"]
        print(f"resuming backbone fit at epoch {start_epoch}")
    gen = torch.Generator().manual_seed(cfg.seed)
    for epoch in range(start_epoch, cfg.fit.epochs):
        if step >= total_steps:
            break
        gen.manual_seed(cfg.seed * 1000 + epoch)  # resumable: the epoch alone fixes its order and augmentation
        model.train()
        t0 = time.perf_counter()
        bar = tqdm(batches(data.train, cfg.fit.batch_size, shuffle=True, generator=gen), total=steps_per_epoch,
                   desc=f"fit-backbone epoch {epoch + 1}/{cfg.fit.epochs}", leave=False)
        running = 0.0
        for images, labels in bar:
            if cfg.fit.augment:
                images = augment(images, gen)
            logits = model(images.to(device))  # [B, C]
            loss = F.cross_entropy(logits, labels.to(device), label_smoothing=cfg.fit.label_smoothing)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
            step += 1
            loss_value = float(loss.detach())
            running = 0.98 * running + 0.02 * loss_value if running else loss_value
            bar.set_postfix(loss=f"{running:.3f}", lr=f"{scheduler.get_last_lr()[0]:.2e}")
            if step >= total_steps:
                break
        elapsed += time.perf_counter() - t0
        val = evaluate_backbone(model, data.val.images, data.val.labels, device)
        history.append({"epoch": epoch + 1, "train_loss": running, **{f"val_{k}": v for k, v in val.items()}})
        print(f"epoch {epoch + 1}: loss {running:.4f} val acc {val['accuracy']:.4f} ece {val['ece']:.4f} "
              f"({elapsed / 60:.1f} min)")
        save_checkpoint(ckpt_path, {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                                    "scheduler": scheduler.state_dict(), "epoch": epoch + 1, "step": step,
                                    "history": history, "elapsed": elapsed, "config": config_dict(cfg)})
    test = evaluate_backbone(model, data.test.images, data.test.labels, device)
    print(f"backbone test: {test}")
    save_checkpoint(final_path, {
        "state_dict": model.state_dict(), "backbone_config": config_dict(cfg)["backbone"],
        "config": config_dict(cfg), "history": history, "test": test, "seconds": elapsed,
        "labels": data.labels,
    })
    return final_path
