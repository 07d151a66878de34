"""``fit-backbone`` for a user's pretrained checkpoint (``pretrained.source``): the checkpoint converted for its family
(``training.families.checkpoint``), its tokenizer written as the run's, and a head fitted only when the checkpoint has
none (``fit.train: head`` trains it on the frozen body; ``all`` fine-tunes everything). A checkpoint with a head is
used as it is: no epoch runs, and its validation and test figures are measured on the user's data."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from training.config import PipelineConfig
from training.data.image_task import load_image_dataset
from training.data.images import augment, batches
from training.data.tokens import TOKENIZER_FILE, raw_text_task, token_batches, tokenize_dataset
from training.families.checkpoint import checkpoint_tokenizer, inspect_checkpoint, load_classifier
from training.fit.task import Batch, FitTask, evaluate_backbone


def pretrained_fit_task(cfg: PipelineConfig, device: torch.device, resume: bool) -> FitTask:
    del resume  # converting the checkpoint is cheap and deterministic: it is redone, the head fit resumes
    source = cfg.pretrained.source
    assert source is not None
    checkpoint = inspect_checkpoint(source, cfg.pretrained.checkpoint, cfg.pretrained.model_args)
    family = checkpoint.family
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    pad_id = None
    if family.modality == "text":
        tokenizer = checkpoint_tokenizer(checkpoint, cfg.text.max_length)
        tokenizer.save(str(run_dir / TOKENIZER_FILE))
        pad_id = int(tokenizer.padding["pad_id"])
        data = tokenize_dataset(tokenizer, cfg.text, raw_text_task(cfg))
    else:
        data = load_image_dataset(cfg)
    model, spec = load_classifier(checkpoint, len(data.labels), pad_id, cfg.text.pooling)
    model = model.to(device)
    if not checkpoint.has_head and cfg.fit.train == "head":
        model.requires_grad_(False)
        family.head(model).requires_grad_(True)
    splits = {"val": data.val, "test": data.test}

    def train_batches(gen: torch.Generator) -> Iterator[Batch]:
        if family.modality == "text":
            yield from token_batches(data.train, cfg.fit.batch_size, True, gen, bucket=cfg.text.bucket)
            return
        for images, labels in batches(data.train, cfg.fit.batch_size, shuffle=True, generator=gen):
            yield (augment(images, gen) if cfg.fit.augment else images,), labels

    def evaluate(fitted: nn.Module, name: str) -> dict[str, float]:
        return evaluate_backbone(fitted, splits[name], device, chunk=256, task=cfg.task.task())

    payload = {"family": family.name, "modality": family.modality, "spec": spec, "labels": data.labels,
               "pretrained": {"source": checkpoint.source, "weights": checkpoint.weights,
                              "architecture": checkpoint.architecture, "has_head": checkpoint.has_head}}
    if family.modality == "text":
        payload["tokenizer"] = TOKENIZER_FILE
    return FitTask(model, len(data.train), train_batches, evaluate, payload, epochs=0 if checkpoint.has_head else None)
