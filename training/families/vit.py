"""The ViT/DeiT family (pre-LN, images): the pipeline's own timm ViT, and Hugging Face or timm checkpoints converted
into the same timm ``VisionTransformer`` (``models.checkpoints``), so one transition view and one artifact serve all
of them."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from models.backbones import ImageClassifier, VitConfig, build_vit, fold_batch_norms
from models.director import ImageDirector, StochasticRollout
from models.kernel import TransitionKernel
from models.vit_view import VitTransitionView
from training.config import PipelineConfig, config_dict
from training.data.image_task import load_image_dataset
from training.data.images import Dataset, Split
from training.data.tokens import TokenDataset
from training.data.unlabeled import perturbed_images
from training.families.base import View


class VitFamily:
    name = "vit"
    modality = "image"
    stats_chunk = 128  # images per teacher forward
    scriptable = True
    causal = False

    def load_data(self, cfg: PipelineConfig) -> Dataset:
        return load_image_dataset(cfg)

    def build_backbone(self, payload: dict[str, Any]) -> ImageClassifier:
        """The pipeline's own ViT (``backbone_config``) or a converted checkpoint (``spec``)."""
        if "spec" in payload:
            from models.checkpoints import vit_from_spec

            model = vit_from_spec(payload["spec"])
        else:
            model = build_vit(VitConfig(**payload["backbone_config"]))
        model.load_state_dict(payload["state_dict"])
        return model

    def head(self, backbone: nn.Module) -> nn.Module:
        vit = backbone.vit
        return nn.ModuleList([vit.head, vit.head_dist]) if hasattr(vit, "head_dist") else vit.head

    def view(self, backbone: nn.Module) -> VitTransitionView:
        assert isinstance(backbone, ImageClassifier)
        return VitTransitionView(backbone)

    def default_readout(self, view: View) -> nn.Module:
        return view.readout_head

    def director(self, view: View, kernel: TransitionKernel, readout: nn.Module | None = None) -> ImageDirector:
        assert isinstance(view, VitTransitionView)
        prefix = view.prefix(view.num_steps - kernel.num_steps)
        return ImageDirector(view.embedding, StochasticRollout(kernel), readout or view.readout_head, prefix)

    def artifact_module(self, scored: nn.Module, cfg: PipelineConfig) -> nn.Module:
        scored.rollout.fold_conditioning()  # adaLN folded into each step's weights
        fold_batch_norms(scored)  # a conv stem's batch norms folded into its convolutions
        return scored

    def describe(self, backbone: nn.Module, cfg: PipelineConfig) -> dict[str, Any]:
        if cfg.pretrained.source is not None:
            vit = backbone.vit
            return {"kind": "pretrained ViT converted to timm VisionTransformer", "source": cfg.pretrained.source,
                    "embed_dim": vit.embed_dim, "depth": len(vit.blocks), "heads": vit.blocks[0].attn.num_heads,
                    "pooling": vit.global_pool}
        kind = "timm VisionTransformer (hybrid conv stem)" if cfg.backbone.stem_channels else "timm VisionTransformer"
        return {"kind": kind, **config_dict(cfg)["backbone"]}

    def classifier(self, backbone: nn.Module) -> nn.Module:
        return backbone  # [B, C, H, W] -> [B, C]

    def contract(self, baseline: nn.Module) -> nn.Module:
        return baseline  # forward(pixels, n_samples) already

    def unlabeled(self, cfg: PipelineConfig, data: Dataset | TokenDataset, copies: int, seed: int) -> Split:
        assert isinstance(data, Dataset)
        train = data.train.images
        return perturbed_images(train[torch.arange(len(train))], copies, seed)  # in memory: copies x the train split

    def text_positions(self, config: Any) -> int | None:
        return None

    def encoder_with_fresh_head(self, source: str, load_args: dict[str, Any], num_classes: int, pooling: str
                                ) -> tuple[nn.Module, dict[str, Any]] | None:
        return None

    def from_hf(self, model: nn.Module, processor: dict[str, Any] | None, pad_id: int | None
                ) -> tuple[nn.Module, dict[str, Any]]:
        from models.checkpoints import vit_from_hf, vit_spec

        classifier, _ = vit_from_hf(model, processor)
        return classifier, vit_spec(classifier)
