"""Image or text, decided once (``modality_of``, from the config's ``modality`` or a checkpoint's): what the pipeline
does differently per modality, behind one interface, instead of a check at every place that differs."""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch import nn

from models.backbones import VitConfig, build_vit
from training.config import PipelineConfig
from training.data import Dataset, Split, load_dataset
from training.text_inputs import TokenDataset, TokenSplit, load_run_tokenizer, raw_text_task, tokenize_dataset
from training.unlabeled import perturbed_images, perturbed_texts

StatsInputs = torch.Tensor | TokenSplit  # the first training inputs: images [n, C, H, W] or tokenised texts
TEXT_CHUNK = 64  # texts per teacher forward: the fp64 mixture variance is [B, H, L, D]


class Modality(Protocol):
    name: str
    stats_chunk: int  # inputs per forward when gathering step statistics

    def load_data(self, cfg: PipelineConfig) -> Dataset | TokenDataset: ...

    def build_backbone(self, payload: dict[str, Any]) -> nn.Module: ...

    def head(self, data: Dataset | TokenDataset, n: int) -> StatsInputs: ...

    def unlabeled(self, cfg: PipelineConfig, data: Dataset | TokenDataset, copies: int, seed: int
                  ) -> Split | TokenSplit: ...


class ImageModality:
    name = "image"
    stats_chunk = 128  # images per teacher forward

    def load_data(self, cfg: PipelineConfig) -> Dataset:
        return load_dataset(cfg.data.dataset, cfg.data.root, cfg.data.val_size, cfg.data.split_seed,
                            cfg.data.train_limit, cfg.data.test_limit)

    def build_backbone(self, payload: dict[str, Any]) -> nn.Module:
        model = build_vit(VitConfig(**payload["backbone_config"]))
        model.load_state_dict(payload["state_dict"])
        return model

    def head(self, data: Dataset | TokenDataset, n: int) -> StatsInputs:
        assert isinstance(data, Dataset)
        return data.train.images[:n]

    def unlabeled(self, cfg: PipelineConfig, data: Dataset | TokenDataset, copies: int, seed: int) -> Split:
        assert isinstance(data, Dataset)
        return perturbed_images(data.train.images, copies, seed)


class TextModality:
    name = "text"
    stats_chunk = TEXT_CHUNK

    def load_data(self, cfg: PipelineConfig) -> TokenDataset:
        """Texts tokenised with the run's own tokenizer (written by fit-backbone)."""
        return tokenize_dataset(load_run_tokenizer(cfg.run_dir), cfg.text, raw_text_task(cfg))

    def build_backbone(self, payload: dict[str, Any]) -> nn.Module:
        from training.text_models import text_classifier_from_payload

        return text_classifier_from_payload(payload)

    def head(self, data: Dataset | TokenDataset, n: int) -> StatsInputs:
        assert isinstance(data, TokenDataset)
        return data.train.head(n)

    def unlabeled(self, cfg: PipelineConfig, data: Dataset | TokenDataset, copies: int, seed: int) -> TokenSplit:
        assert isinstance(data, TokenDataset)
        return perturbed_texts(load_run_tokenizer(cfg.run_dir), data.train.texts, copies, cfg.text.max_characters,
                               seed)


MODALITIES: dict[str, Modality] = {"image": ImageModality(), "text": TextModality()}


def modality_of(name: str) -> Modality:
    """The modality named by a config (``cfg.modality``) or a checkpoint (``payload["modality"]``)."""
    return MODALITIES[name]
