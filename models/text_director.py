"""The text artifact: DIRECTOR on a text classifier as plain, scriptable modules (docs/method.md; the contract:
docs/architecture.md). One ``TextDirector`` serves every text family: a BERT-family encoder's parts are here, a
Qwen2 / Llama decoder's in ``models.decoder_layers`` (``models.decoder_director`` builds its director).

transformers modules do not script reliably, so the parts of the encoder the artifact needs are re-implemented
here with copied weights: ``TokenEmbedding`` (word + position + segment-0 embedding, LayerNorm; the word table a
``models.half_storage.WordTable``: optionally half precision or int8 with a per-row scale, dequantised on lookup) and
``TextReadout`` (the last feed-forward sublayer, pooling over real tokens, head); the encoder's sublayers are
``models.text_layers``. ``TextDirector`` chains the embedding, the deterministic prefix (partial depth: the first
T - K transitions as the real layers, once per input), ``StochasticRollout`` over the last K steps and the readout
under the artifact contract:

- ``forward(input_ids [B, L] int64, attention_mask [B, L] int64, n_samples) -> logits [S, B, C]``
- ``sample_rows(input_ids, attention_mask, repeats [B] int64) -> logits [sum(repeats), C]``, rows grouped by input
- ``scored_rows(input_ids, attention_mask, repeats) -> (logits [sum(repeats), C], scores [B, 1 + F])``: the kernel
  error, then the feature-space scores when the artifact carries them (``models.director.input_scores``)

Inputs are right-padded (positions start at 0 in every row: a text's tokens must start at position 0). Padding
changes nothing: every part is per token except attention (padding keys masked) and pooling (over real tokens).
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from transformers.models.bert.modeling_bert import BertEmbeddings

from models.bert_view import BertReadout, BertTransitionView
from models.director import NoFeatureScores, StochasticRollout, input_scores
from models.half_storage import WordTable, store_linears_in_half
from models.kernel import TransitionKernel
from models.text_backbones import ClassifierHead
from models.text_layers import TextFeedForward, TextPrefix


class TokenEmbedding(WordTable):
    """input_ids [B, L] -> X_0 [B, L, D]: word + absolute position + segment-0 embedding, then LayerNorm.

    The word table (``table_dtype``, see ``WordTable``) is the bulk of a text artifact (MiniLM: 30522 x 384). Only
    the first ``max_positions`` position rows are kept: longer inputs are refused (the tokenizer truncates to the
    manifest's max_length).
    """

    def __init__(self, word: torch.Tensor, position: torch.Tensor, segment: torch.Tensor, norm: nn.LayerNorm,
                 table_dtype: str = "float32") -> None:
        super().__init__(word, table_dtype)
        self.register_buffer("position", position.detach().float().clone())  # [P, D]
        self.register_buffer("segment", segment.detach().float().clone())  # [D]
        self.norm = copy.deepcopy(norm)

    @classmethod
    def from_bert(cls, embeddings: BertEmbeddings, table_dtype: str = "float32",
                  max_positions: int | None = None) -> TokenEmbedding:
        """Copy a transformers ``BertEmbeddings`` (absolute positions, segment 0 for every token)."""
        position = embeddings.position_embeddings.weight  # [P, D]
        if max_positions is not None:
            position = position[:max_positions]
        return cls(embeddings.word_embeddings.weight, position, embeddings.token_type_embeddings.weight[0],
                   embeddings.LayerNorm, table_dtype)

    def restored(self, table_dtype: str | None, max_positions: int | None = None) -> TokenEmbedding:
        """This embedding with its word table re-stored as ``table_dtype`` (None: unchanged) and the position table
        cut to ``max_positions`` (None: all of it); itself when nothing changes."""
        if (table_dtype is None or table_dtype == self.table_dtype) and max_positions is None:
            return self
        position = self.position if max_positions is None else self.position[:max_positions]  # [P, D]
        return TokenEmbedding(self.float_table(), position, self.segment, self.norm, table_dtype or self.table_dtype)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        length = input_ids.shape[1]
        if length > self.position.shape[0]:
            raise ValueError("input longer than the artifact's max_length: truncate it first")
        x = self.words(input_ids) + self.position[:length]  # [B, L, D]
        x = x + self.segment  # [B, L, D] one segment
        return self.norm(x)  # [B, L, D]


class TextReadout(nn.Module):
    """X_T [R, L, D] -> logits [R, C]: the last feed-forward sublayer, pooling over real tokens (``key_padding_mask``
    [R, L] True for real tokens) or the [CLS] token, head: a copy of the classifier's ``nn.Linear`` or of its
    ``ClassifierHead`` (dense, activation, output layer; scriptable as it is)."""

    def __init__(self, feed_forward: TextFeedForward, head: nn.Linear | ClassifierHead, pooling: str = "mean"
                 ) -> None:
        super().__init__()
        if pooling not in ("mean", "cls"):
            raise ValueError(f"unknown pooling {pooling!r}")
        if not isinstance(head, nn.Linear | ClassifierHead):
            raise TypeError(f"a text head is nn.Linear or ClassifierHead, got {type(head).__name__}")
        self.feed_forward = feed_forward
        # one head type, so that ``features`` scripts: a linear head is a ClassifierHead with no dense layer
        self.head = copy.deepcopy(head) if isinstance(head, ClassifierHead) else ClassifierHead(copy.deepcopy(head))
        self.cls_pooling = pooling == "cls"

    @classmethod
    def from_bert(cls, readout: BertReadout) -> TextReadout:
        """Copy a ``BertReadout`` (the frozen view's readout) into plain modules."""
        return cls(TextFeedForward.from_bert(readout.last_layer), readout.head, readout.pooling)

    def pooled(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None) -> torch.Tensor:
        h = self.feed_forward(x)  # [R, L, D] = last_hidden_state
        if self.cls_pooling:
            return h[:, 0]  # [R, D]
        if key_padding_mask is None:
            return h.mean(dim=1)  # [R, D]
        real = key_padding_mask.to(h.dtype).unsqueeze(-1)  # [R, L, 1]
        return (h * real).sum(dim=1) / real.sum(dim=1).clamp_min(1.0)  # [R, D]

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.head(self.pooled(x, key_padding_mask))  # [R, C]

    def features(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        """X_T [R, L, D] -> the final linear layer's input [R, D'] (after a head's dense layer and activation)."""
        return self.head.hidden(self.pooled(x, key_padding_mask))  # [R, D']

    @torch.jit.unused
    def final_layer(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(weight [C, D'], bias [C]) with logits = features @ weight.T + bias."""
        return self.head.out.weight.detach(), self.head.out.bias.detach()


class TextDirector(nn.Module):
    """Artifact-contract text model for every text family (BERT-family encoders, Qwen2 / Llama decoders):
    ``forward(input_ids, attention_mask, n_samples) -> [S, B, C]`` logits, ``sample_rows(input_ids, attention_mask,
    repeats) -> [sum(repeats), C]`` and ``scored_rows``. The parts are the family's own plain modules: the embedding
    (input_ids [B, L] -> [B, L, D]), the prefix and the readout (each given the [B, L] real-token mask); what
    differs between families (absolute positions or rotary, bidirectional or causal attention, mean / [CLS] or
    last-token pooling) lives in them."""

    def __init__(self, embedding: nn.Module, rollout: StochasticRollout, readout: nn.Module,
                 prefix: nn.Module | None = None) -> None:
        super().__init__()
        self.embedding = embedding
        self.prefix = prefix if prefix is not None else TextPrefix([], [])
        self.rollout = rollout
        self.readout = readout
        self.feature_scorer: nn.Module = NoFeatureScores()

    @torch.jit.export
    def sample_rows(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, repeats: torch.Tensor
                    ) -> torch.Tensor:
        mask = attention_mask > 0  # [B, L] True for real tokens
        x_start = self.prefix(self.embedding(input_ids), mask)  # [B, L, D] deterministic, once per input
        x_t = self.rollout(x_start, repeats, mask)  # [R, L, D]
        row_mask = torch.repeat_interleave(mask, repeats, dim=0, output_size=x_t.shape[0])  # [R, L]
        return self.readout(x_t, row_mask)  # [R, C]

    @torch.jit.export
    def scored_rows(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, repeats: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``sample_rows`` and every input's scores [B, 1 + F] (``models.director.input_scores``) in one forward (needs
        the teacher transitions)."""
        mask = attention_mask > 0  # [B, L] True for real tokens
        x_start = self.prefix(self.embedding(input_ids), mask)  # [B, L, D] deterministic, once per input
        x_t, error, teacher_end = self.rollout.forward_scored(x_start, repeats, mask)  # [R, L, D], [B], [B, L, D]
        scores = input_scores(error, self.feature_scorer(self.readout.features(teacher_end, mask)))  # [B, 1 + F]
        row_mask = torch.repeat_interleave(mask, repeats, dim=0, output_size=x_t.shape[0])  # [R, L]
        return self.readout(x_t, row_mask), scores  # [R, C], [B, 1 + F]

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, n_samples: int) -> torch.Tensor:
        batch = input_ids.shape[0]
        repeats = torch.full((batch,), n_samples, dtype=torch.long, device=input_ids.device)
        rows = self.sample_rows(input_ids, attention_mask, repeats)  # [B*S, C] grouped by input
        return rows.view(batch, n_samples, -1).transpose(0, 1)  # [S, B, C]


def text_director_from_view(view: BertTransitionView, kernel: TransitionKernel, readout: TextReadout | None = None,
                            table_dtype: str = "float32", max_positions: int | None = None) -> TextDirector:
    """DIRECTOR on the frozen view's own embedding, prefix (the first T - K transitions, K = the kernel's steps) and
    readout, copied into plain modules (a float32 table reproduces the encoder's X_0 exactly)."""
    embedding = TokenEmbedding.from_bert(view.embedding.embeddings, table_dtype, max_positions)
    prefix = view.prefix(view.num_steps - kernel.num_steps)
    return TextDirector(embedding, StochasticRollout(kernel), readout or TextReadout.from_bert(view.readout_head),
                        prefix)


def fold_for_artifact(director: TextDirector, table_dtype: str | None = None, max_positions: int | None = None,
                      layer_dtype: str = "float32") -> TextDirector:
    """A copy for export, in eval mode: the kernel folded (``models.folded_kernel``: each step's adaLN modulation in
    that step's weights, its MLPs dropped); the word table re-stored as ``table_dtype`` (default: unchanged), an
    absolute position table cut to ``max_positions`` (a decoder's rotary positions have none) and, with
    ``layer_dtype`` float16, the linear layers of the prefix, the teacher transitions (if any) and the readout's
    feed-forward sublayer stored in half precision (the head stays float32)."""
    folded = copy.deepcopy(director).eval().requires_grad_(False)  # an inference artifact
    folded.embedding = folded.embedding.restored(table_dtype, max_positions)
    store_layers(layer_dtype, folded.prefix, folded.rollout.teacher, folded.readout.feed_forward)
    folded.rollout.fold_conditioning()
    return folded


def store_layers(layer_dtype: str, *modules: nn.Module) -> None:
    """The linear layers inside ``modules`` stored as ``layer_dtype`` in place (float32: as they are)."""
    if layer_dtype == "float16":
        for module in modules:
            store_linears_in_half(module)
    elif layer_dtype != "float32":
        raise ValueError(f"layer_dtype must be float32 or float16, got {layer_dtype!r}")


class TextBackbone(nn.Module):
    """The plain fine-tuned classifier of any text family under the artifact contract (the deterministic baseline
    served beside DIRECTOR): embedding, all T transitions as the prefix, readout; every sample row of an input is the
    same logit vector."""

    def __init__(self, embedding: nn.Module, prefix: nn.Module, readout: nn.Module) -> None:
        super().__init__()
        self.embedding = embedding
        self.prefix = prefix
        self.readout = readout

    @classmethod
    def frozen(cls, embedding: nn.Module, prefix: nn.Module, readout: nn.Module, layer_dtype: str = "float32"
               ) -> TextBackbone:
        """The baseline for export: eval mode, no gradients, the prefix's and the readout's feed-forward linear
        layers stored as ``layer_dtype``."""
        module = cls(embedding, prefix, readout).eval()
        store_layers(layer_dtype, module.prefix, module.readout.feed_forward)
        return module.requires_grad_(False)

    @classmethod
    def from_view(cls, view: BertTransitionView, table_dtype: str = "float32", max_positions: int | None = None,
                  layer_dtype: str = "float32") -> TextBackbone:
        embedding = TokenEmbedding.from_bert(view.embedding.embeddings, table_dtype, max_positions)
        return cls.frozen(embedding, view.prefix(view.num_steps), TextReadout.from_bert(view.readout_head),
                          layer_dtype)

    def logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        mask = attention_mask > 0  # [B, L]
        return self.readout(self.prefix(self.embedding(input_ids), mask), mask)  # [B, C]

    @torch.jit.export
    def sample_rows(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, repeats: torch.Tensor
                    ) -> torch.Tensor:
        logits = self.logits(input_ids, attention_mask)  # [B, C]
        return torch.repeat_interleave(logits, repeats, dim=0, output_size=int(repeats.sum()))  # [R, C]

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, n_samples: int) -> torch.Tensor:
        return self.logits(input_ids, attention_mask).unsqueeze(0).expand(n_samples, -1, -1)  # [S, B, C]
