"""What a backbone family contributes to the pipeline, behind one interface (``Family``), so that stages never ask
which architecture or modality they hold: the family is decided once, from the config or the run's backbone
checkpoint (``training.families.registry``)."""

from __future__ import annotations

from typing import Any, Protocol

from torch import nn

from models.director import ImageDirector
from models.kernel import TransitionKernel
from models.text_director import TextDirector
from models.transition_view import TransitionView
from training.config import PipelineConfig
from training.data.images import Dataset, Split
from training.data.tokens import TokenDataset, TokenSplit

View = TransitionView  # the frozen teacher re-read as transitions (models.transition_view)
Director = ImageDirector | TextDirector | nn.Module


class Family(Protocol):
    """One supported architecture family (docs/your-own-model.md lists them)."""

    name: str  # "vit" | "bert" | "decoder"
    modality: str  # "image" | "text": the artifact's inputs and the evaluation's sets
    stats_chunk: int  # inputs per forward when gathering step statistics
    scriptable: bool  # whether the evaluation's baseline modules script (transformers modules do not: pickled)
    causal: bool  # whether the kernel's attention is causal like the backbone's

    def load_data(self, cfg: PipelineConfig) -> Dataset | TokenDataset: ...

    def build_backbone(self, payload: dict[str, Any]) -> nn.Module:
        """The classifier saved in a ``backbone.pt`` payload (weights loaded; the caller sets eval and device)."""
        ...

    def head(self, backbone: nn.Module) -> nn.Module:
        """The classification head (what ``fit.train: head`` trains on the frozen body)."""
        ...

    def view(self, backbone: nn.Module) -> View: ...

    def default_readout(self, view: View) -> nn.Module: ...

    def director(self, view: View, kernel: TransitionKernel, readout: nn.Module | None = None) -> Director: ...

    def artifact_module(self, scored: Director, cfg: PipelineConfig) -> Director:
        """The module the exporter scripts: ``scored`` (a DIRECTOR carrying its teacher transitions) folded for
        inference (the step conditioning into buffers; text tables and layers stored as the config says)."""
        ...

    def describe(self, backbone: nn.Module, cfg: PipelineConfig) -> dict[str, Any]:
        """The manifest's provenance entry for the backbone."""
        ...

    def classifier(self, backbone: nn.Module) -> nn.Module: ...

    def contract(self, baseline: nn.Module) -> nn.Module: ...

    def unlabeled(self, cfg: PipelineConfig, data: Dataset | TokenDataset, copies: int, seed: int
                  ) -> Split | TokenSplit: ...

    def text_positions(self, config: Any) -> int | None:
        """How many token positions a text may take, from a Hugging Face config (None: no fixed table to outgrow)."""
        ...

    def encoder_with_fresh_head(self, source: str, load_args: dict[str, Any], num_classes: int, pooling: str
                                ) -> tuple[nn.Module, dict[str, Any]] | None:
        """A checkpoint without a head as this family's classifier with a fresh one, and its spec; None when the
        ``*For...Classification`` class's own fresh head is the one to take."""
        ...

    def from_hf(self, model: nn.Module, processor: dict[str, Any] | None, pad_id: int | None
                ) -> tuple[nn.Module, dict[str, Any]]:
        """A transformers classifier as this family's classifier and the spec that rebuilds it (``processor``: an
        image checkpoint's processor configuration; ``pad_id``: a text tokenizer's padding token)."""
        ...
