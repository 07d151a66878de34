"""The KEP-SVGP baseline (``models.kep_svgp``, ``models.text_kep_svgp``) fine-tuned from the run's fitted backbone, a
ViT or a BERT-family text classifier.

The backbone's last ``kep_svgp.layers`` attention layers are replaced by KEP-SVGP attention (queries, keys and output
projection start from the backbone's) and trained with the method's objective, the negative ELBO with the KSVD
regulariser, per batch: ``CE(one sampled logit row per input) + kl_weight * KL + ksvd_weight * KSVD`` (AdamW, warm-up
and cosine). The embedding and the layers before stay frozen unless ``train_prefix``. Resumable: a checkpoint per
epoch in ``<run_dir>/baselines/kep_svgp/``; the result, with the replaced layers and the training time, in
``kep_svgp.pt`` there.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml
from torch.nn import functional as F
from tqdm import tqdm

from models.backbones import ImageClassifier
from models.kep_svgp import KepSvgpClassifier
from models.text_backbones import TextClassifier
from models.text_kep_svgp import TextKepSvgpClassifier
from training.config import KepSvgpConfig, PipelineConfig, config_dict, load_config
from training.data.images import augment, batches
from training.data.tokens import TokenSplit, bucketed_indices, token_batches
from training.loading import AnySplit, load_backbone, load_data
from training.metrics import classification_report
from training.runtime import (
    load_checkpoint,
    save_checkpoint,
    seed_everything,
    select_device,
    set_threads,
    warmup_cosine,
)

KEP_SVGP_FILE = "kep_svgp.pt"
CHECKPOINT_FILE = "kep_svgp_ckpt.pt"
LOG_EVERY = 20  # steps between progress-bar updates


def kep_svgp_dir(cfg: PipelineConfig) -> Path:
    return Path(cfg.run_dir) / "baselines" / "kep_svgp"


KepSvgpModel = KepSvgpClassifier | TextKepSvgpClassifier
Batch = tuple[tuple[torch.Tensor, ...], torch.Tensor]  # (model inputs, labels)


def build_kep_svgp(cfg: PipelineConfig, backbone: torch.nn.Module, kcfg: KepSvgpConfig) -> KepSvgpModel:
    """The run's backbone with KEP-SVGP attention in its last ``kcfg.layers`` layers: a timm ViT, or a BERT-family
    text classifier (attention over each text's real tokens, ``cfg.text.max_length`` at most)."""
    if isinstance(backbone, ImageClassifier):
        return KepSvgpClassifier(backbone, kcfg.layers, kcfg.rank, kcfg.rank_multi)
    if isinstance(backbone, TextClassifier):
        return TextKepSvgpClassifier(backbone, kcfg.layers, kcfg.rank, kcfg.rank_multi, cfg.text.max_length)
    raise ValueError(f"KEP-SVGP is built for ViT and BERT-family text classifiers, not {type(backbone).__name__}")


def load_kep_svgp(cfg: PipelineConfig, device: torch.device | str = "cpu") -> KepSvgpModel:
    """The fine-tuned KEP-SVGP classifier of a run (eval mode, frozen), built as it was trained."""
    payload = load_checkpoint(kep_svgp_dir(cfg) / KEP_SVGP_FILE)
    kcfg = KepSvgpConfig(**payload["kep_svgp_config"])
    model = build_kep_svgp(cfg, load_backbone(cfg.run_dir), kcfg)
    model.load_state_dict(payload["state_dict"])
    return model.to(device).eval().requires_grad_(False)


@dataclass
class Training:
    """Where one fine-tuning stands: what a checkpoint saves and a resumed run starts from."""

    model: KepSvgpModel
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    steps_per_epoch: int
    total_steps: int
    epoch: int = 0
    step: int = 0
    elapsed: float = 0.0
    history: list[dict[str, Any]] = field(default_factory=list)

    def state(self, cfg: PipelineConfig) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(), "epoch": self.epoch, "step": self.step,
                "elapsed": self.elapsed, "history": self.history, "config": config_dict(cfg)}

    def restore(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.epoch, self.step, self.elapsed, self.history = (state["epoch"], state["step"], state["elapsed"],
                                                             state["history"])


def trainable_parameters(model: KepSvgpModel, train_prefix: bool) -> list[torch.nn.Parameter]:
    """The replaced layers, the final norms and the head (and the frozen part too with ``train_prefix``)."""
    model.requires_grad_(True)
    if not train_prefix:
        for part in model.frozen_parts():
            part.requires_grad_(False)
    return [p for p in model.parameters() if p.requires_grad]


def epoch_steps(cfg: PipelineConfig, train: AnySplit) -> int:
    """Mini-batches per epoch (texts: each window of similar lengths ends in a partial batch)."""
    kcfg = cfg.kep_svgp
    if isinstance(train, TokenSplit):
        return len(bucketed_indices(train.lengths, kcfg.batch_size, False, bucket=cfg.text.bucket))
    return -(-len(train) // kcfg.batch_size)


def train_batches(cfg: PipelineConfig, train: AnySplit, gen: torch.Generator) -> Iterator[Batch]:
    """One epoch's shuffled mini-batches: images (augmented with ``kep_svgp.augment``), or texts of similar length."""
    kcfg = cfg.kep_svgp
    if isinstance(train, TokenSplit):
        yield from token_batches(train, kcfg.batch_size, True, gen, bucket=cfg.text.bucket)
        return
    for images, labels in batches(train, kcfg.batch_size, shuffle=True, generator=gen):
        yield ((augment(images, gen) if kcfg.augment else images),), labels


def prepare(cfg: PipelineConfig, steps_per_epoch: int, device: torch.device, resume: bool) -> Training:
    kcfg = cfg.kep_svgp
    model = build_kep_svgp(cfg, load_backbone(cfg.run_dir), kcfg).to(device)
    params = trainable_parameters(model, kcfg.train_prefix)
    optimizer = torch.optim.AdamW(params, lr=kcfg.lr, weight_decay=kcfg.weight_decay)
    total = steps_per_epoch * kcfg.epochs if kcfg.max_steps is None else min(kcfg.max_steps,
                                                                             steps_per_epoch * kcfg.epochs)
    training = Training(model, optimizer, warmup_cosine(optimizer, kcfg.warmup_steps, total), steps_per_epoch, total)
    ckpt = kep_svgp_dir(cfg) / CHECKPOINT_FILE
    if resume and ckpt.exists():
        training.restore(load_checkpoint(ckpt))
        print(f"resuming KEP-SVGP fine-tuning at epoch {training.epoch}")
    return training


def train_epoch(cfg: PipelineConfig, training: Training, train: AnySplit, device: torch.device) -> dict[str, float]:
    """One epoch of ``CE + kl_weight * KL + ksvd_weight * KSVD``; the epoch's mean of each term."""
    kcfg, model = cfg.kep_svgp, training.model
    gen = torch.Generator().manual_seed(cfg.seed * 1000 + training.epoch)  # the epoch alone fixes its order
    model.train()
    for part in model.frozen_parts():
        part.train(kcfg.train_prefix)
    sums = torch.zeros(3, device=device)  # CE, KL, KSVD summed over steps
    steps = 0
    t0 = time.perf_counter()
    bar = tqdm(train_batches(cfg, train, gen), total=training.steps_per_epoch,
               desc=f"kep-svgp epoch {training.epoch + 1}/{kcfg.epochs}", leave=False)
    for inputs, labels in bar:
        logits, ksvd = model.forward_terms(*(x.to(device) for x in inputs))  # [B, C], []
        ce = F.cross_entropy(logits, labels.to(device))
        kl = model.kl()
        loss = ce + kcfg.kl_weight * kl + kcfg.ksvd_weight * ksvd
        training.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        training.optimizer.step()
        training.scheduler.step()
        training.step += 1
        steps += 1
        sums += torch.stack([ce.detach(), kl.detach(), ksvd.detach()])
        if steps % LOG_EVERY == 1:
            ce_mean, kl_mean, ksvd_mean = (sums / steps).tolist()
            bar.set_postfix(ce=f"{ce_mean:.3f}", kl=f"{kl_mean:.1f}", ksvd=f"{ksvd_mean:.3g}")
        if training.step >= training.total_steps:
            break
    training.elapsed += time.perf_counter() - t0
    ce_mean, kl_mean, ksvd_mean = (sums / max(steps, 1)).tolist()
    return {"train_ce": ce_mean, "train_kl": kl_mean, "train_ksvd": ksvd_mean}


@torch.no_grad()
def evaluate_sampled(model: KepSvgpModel, split: AnySplit, n_samples: int, device: torch.device,
                     chunk: int = 256) -> dict[str, float]:
    """Accuracy, NLL, ECE, ... of the mean of ``n_samples`` sampled softmaxes per input."""
    model.eval()
    probs = split.map(lambda *inputs: model(*inputs, n_samples).softmax(-1).mean(0).cpu(), chunk, device)  # [N, C]
    return classification_report(probs, split.labels)


def train_kep_svgp(cfg: PipelineConfig, resume: bool = True) -> Path:
    """Fine-tune (resumable, one checkpoint per epoch) and write ``kep_svgp.pt`` with the replaced layers, the
    training time and the validation figures beside the weights."""
    kcfg, out_dir = cfg.kep_svgp, kep_svgp_dir(cfg)
    set_threads(cfg.threads)
    seed_everything(cfg.seed)
    device = select_device(cfg.device)
    data = load_data(cfg)
    training = prepare(cfg, epoch_steps(cfg, data.train), device, resume)
    val = data.val.head(kcfg.val_images)
    while training.epoch < kcfg.epochs and training.step < training.total_steps:
        record = train_epoch(cfg, training, data.train, device)
        report = evaluate_sampled(training.model, val, kcfg.val_samples, device)
        training.epoch += 1
        training.history.append({"epoch": training.epoch, **record, **{f"val_{k}": v for k, v in report.items()}})
        print(f"kep-svgp epoch {training.epoch}: ce {record['train_ce']:.4f} kl {record['train_kl']:.1f} "
              f"ksvd {record['train_ksvd']:.3g} val acc {report['accuracy']:.4f} ece {report['ece']:.4f} "
              f"nll {report['nll']:.4f} ({training.elapsed / 60:.1f} min)")
        save_checkpoint(out_dir / CHECKPOINT_FILE, training.state(cfg))
    model = training.model
    replaced = [i + 1 for i in model.replaced]  # 1-based layer numbers
    save_checkpoint(out_dir / KEP_SVGP_FILE, {
        "state_dict": model.state_dict(), "kep_svgp_config": config_dict(cfg)["kep_svgp"], "config": config_dict(cfg),
        "replaced_layers": replaced, "num_layers": model.num_layers,
        "seconds": training.elapsed, "history": training.history})
    print(f"KEP-SVGP (layers {replaced} of {model.num_layers} replaced) written to "
          f"{out_dir / KEP_SVGP_FILE} after {training.elapsed / 60:.1f} min of training")
    return out_dir / KEP_SVGP_FILE


def main(argv: list[str] | None = None) -> int:
    """``python -m training.baselines.kep_svgp --config configs/fashion_vit.yaml [--set kep_svgp.epochs=1]``"""
    parser = argparse.ArgumentParser(description="Fine-tune the KEP-SVGP baseline from a run's fitted backbone.")
    parser.add_argument("--config", required=True)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--no-resume", action="store_true")
    args = parser.parse_args(argv)
    overrides = {key: yaml.safe_load(value) for key, _, value in (pair.partition("=") for pair in args.set)}
    train_kep_svgp(load_config(args.config, overrides), resume=not args.no_resume)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
