"""Image or text, decided once (``modality_of``, from the config's ``modality`` or a checkpoint's): what the pipeline
does differently per modality, behind one interface, instead of a check at every place that differs."""

from __future__ import annotations

from typing import Any, Protocol

from torch import nn

from models.backbones import ImageClassifier, VitConfig, build_vit
from models.baselines import PackedTokenClassifier, TokenInputs
from models.bert_view import BertTransitionView
from models.director import ImageDirector, StochasticRollout
from models.kernel import TransitionKernel
from models.text_backbones import TextClassifier
from models.text_director import TextDirector, TextReadout, text_director_from_view
from models.vit_view import VitTransitionView
from training.config import PipelineConfig
from training.data import Dataset, Split, load_dataset
from training.text_inputs import TokenDataset, TokenSplit, load_run_tokenizer, raw_text_task, tokenize_dataset
from training.unlabeled import UNLABELED_CORPORA, perturbed_images, unlabeled_texts

View = VitTransitionView | BertTransitionView
Director = ImageDirector | TextDirector


class Modality(Protocol):
    name: str
    stats_chunk: int  # inputs per forward when gathering step statistics
    scriptable: bool  # whether the evaluation's baseline modules script (transformers modules do not: pickled)

    def load_data(self, cfg: PipelineConfig) -> Dataset | TokenDataset: ...

    def build_backbone(self, payload: dict[str, Any]) -> nn.Module: ...

    def view(self, backbone: nn.Module) -> View: ...

    def default_readout(self, view: View) -> nn.Module: ...

    def director(self, view: View, kernel: TransitionKernel, readout: nn.Module | None = None) -> Director: ...

    def classifier(self, backbone: nn.Module) -> nn.Module: ...

    def contract(self, baseline: nn.Module) -> nn.Module: ...

    def unlabeled(self, cfg: PipelineConfig, data: Dataset | TokenDataset, copies: int, seed: int
                  ) -> Split | TokenSplit: ...


class ImageModality:
    name = "image"
    stats_chunk = 128  # images per teacher forward
    scriptable = True

    def load_data(self, cfg: PipelineConfig) -> Dataset:
        return load_dataset(cfg.data.dataset, cfg.data.root, cfg.data.val_size, cfg.data.split_seed,
                            cfg.data.train_limit, cfg.data.test_limit)

    def build_backbone(self, payload: dict[str, Any]) -> nn.Module:
        model = build_vit(VitConfig(**payload["backbone_config"]))
        model.load_state_dict(payload["state_dict"])
        return model

    def view(self, backbone: nn.Module) -> VitTransitionView:
        assert isinstance(backbone, ImageClassifier)
        return VitTransitionView(backbone)

    def default_readout(self, view: View) -> nn.Module:
        return view.readout_head

    def director(self, view: View, kernel: TransitionKernel, readout: nn.Module | None = None) -> ImageDirector:
        assert isinstance(view, VitTransitionView)
        prefix = view.prefix(view.num_steps - kernel.num_steps)
        return ImageDirector(view.embedding, StochasticRollout(kernel), readout or view.readout_head, prefix)

    def classifier(self, backbone: nn.Module) -> nn.Module:
        return backbone  # [B, C, H, W] -> [B, C]

    def contract(self, baseline: nn.Module) -> nn.Module:
        return baseline  # forward(pixels, n_samples) already

    def unlabeled(self, cfg: PipelineConfig, data: Dataset | TokenDataset, copies: int, seed: int) -> Split:
        assert isinstance(data, Dataset)
        return perturbed_images(data.train.images, copies, seed)


class TextModality:
    name = "text"
    stats_chunk = TokenSplit.teacher_chunk
    scriptable = False

    def load_data(self, cfg: PipelineConfig) -> TokenDataset:
        """Texts tokenised with the run's own tokenizer (written by fit-backbone)."""
        return tokenize_dataset(load_run_tokenizer(cfg.run_dir), cfg.text, raw_text_task(cfg))

    def build_backbone(self, payload: dict[str, Any]) -> nn.Module:
        from training.text_models import text_classifier_from_payload

        return text_classifier_from_payload(payload)

    def view(self, backbone: nn.Module) -> BertTransitionView:
        assert isinstance(backbone, TextClassifier)
        return BertTransitionView(backbone)

    def default_readout(self, view: View) -> nn.Module:
        """The readout's plain-module copy (the encoder's own head does not script)."""
        return TextReadout.from_bert(view.readout_head)

    def director(self, view: View, kernel: TransitionKernel, readout: nn.Module | None = None) -> TextDirector:
        assert isinstance(view, BertTransitionView) and (readout is None or isinstance(readout, TextReadout))
        return text_director_from_view(view, kernel, readout)

    def classifier(self, backbone: nn.Module) -> nn.Module:
        return PackedTokenClassifier(backbone)  # packed (ids, mask) [B, 2, L] -> [B, C]: the baselines serve text

    def contract(self, baseline: nn.Module) -> nn.Module:
        return TokenInputs(baseline)  # forward(ids, mask, n_samples)

    def unlabeled(self, cfg: PipelineConfig, data: Dataset | TokenDataset, copies: int, seed: int) -> TokenSplit:
        assert isinstance(data, TokenDataset)
        name = cfg.distil.unlabeled_corpus
        corpus = UNLABELED_CORPORA[name]() if name is not None else []
        return unlabeled_texts(load_run_tokenizer(cfg.run_dir), data.train.texts, copies, cfg.text.max_characters,
                               seed, corpus)


MODALITIES: dict[str, Modality] = {"image": ImageModality(), "text": TextModality()}


def modality_of(name: str) -> Modality:
    """The modality named by a config (``cfg.modality``) or a checkpoint (``payload["modality"]``)."""
    return MODALITIES[name]
