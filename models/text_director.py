"""The text artifact: DIRECTOR on a BERT-family encoder as plain, scriptable modules (docs/method.md; the contract:
docs/architecture.md).

transformers modules do not script reliably, so the parts of the encoder the artifact needs are re-implemented
here with copied weights: ``TokenEmbedding`` (word + position + segment-0 embedding, LayerNorm; the word table
optionally half precision or int8 with a per-row scale, dequantised on lookup) and ``TextReadout`` (the last
feed-forward sublayer, pooling over real tokens, head); the encoder's sublayers are ``models.text_layers``.
``TextDirector`` chains the embedding, the deterministic prefix (partial depth: the first T - K transitions as the
real layers, once per input), ``StochasticRollout`` over the last K steps and the readout under the artifact
contract:

- ``forward(input_ids [B, L] int64, attention_mask [B, L] int64, n_samples) -> logits [S, B, C]``
- ``sample_rows(input_ids, attention_mask, repeats [B] int64) -> logits [sum(repeats), C]``, rows grouped by input.

Inputs are right-padded (BERT positions are absolute: a text's tokens must start at position 0). Padding changes
nothing: every part is per token except attention (padding keys masked) and pooling (over real tokens).
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from transformers.models.bert.modeling_bert import BertEmbeddings

from models.bert_view import BertReadout, BertTransitionView
from models.director import StochasticRollout
from models.half_storage import store_linears_in_half
from models.kernel import TransitionKernel
from models.text_backbones import ClassifierHead
from models.text_layers import TextFeedForward, TextPrefix

TABLE_DTYPES: tuple[str, ...] = ("float32", "float16", "int8")


def quantize_rows(table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-row int8: table [V, D] -> (int8 codes [V, D], float32 scales [V]); row v is ``codes[v] *
    scales[v]`` within ``scales[v] / 2`` per element (the scale is the row's max |value| / 127)."""
    table = table.float()
    scales = table.abs().amax(dim=1).clamp_min(1e-12) / 127.0  # [V]
    codes = torch.round(table / scales[:, None]).clamp(-127, 127).to(torch.int8)  # [V, D]
    return codes, scales


class TokenEmbedding(nn.Module):
    """input_ids [B, L] -> X_0 [B, L, D]: word + absolute position + segment-0 embedding, then LayerNorm.

    The word table (``table_dtype``: float32, float16, or int8 with one float32 scale per row) is the bulk of a
    text artifact (MiniLM: 30522 x 384); it is dequantised to float32 on lookup. Only the first ``max_positions``
    position rows are kept: longer inputs are refused (the tokenizer truncates to the manifest's max_length).
    """

    def __init__(self, word: torch.Tensor, position: torch.Tensor, segment: torch.Tensor, norm: nn.LayerNorm,
                 table_dtype: str = "float32") -> None:
        super().__init__()
        if table_dtype not in TABLE_DTYPES:
            raise ValueError(f"unknown table dtype {table_dtype!r}; expected one of {TABLE_DTYPES}")
        self.table_dtype = table_dtype
        self.quantized = table_dtype == "int8"
        word = word.detach().float()
        if self.quantized:
            table, scale = quantize_rows(word)
        else:
            table, scale = word.to(getattr(torch, table_dtype)).clone(), torch.zeros(0)
        self.register_buffer("word_table", table)  # [V, D]
        self.register_buffer("word_scale", scale)  # [V] int8 only
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

    @property
    def vocab_size(self) -> int:
        return int(self.word_table.shape[0])

    def words(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids [B, L] -> the word vectors [B, L, D] in float32."""
        rows = self.word_table[input_ids].float()  # [B, L, D]
        if self.quantized:
            rows = rows * self.word_scale[input_ids].unsqueeze(-1)  # [B, L, D]
        return rows

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
        self.head = copy.deepcopy(head)
        self.cls_pooling = pooling == "cls"

    @classmethod
    def from_bert(cls, readout: BertReadout) -> TextReadout:
        """Copy a ``BertReadout`` (the frozen view's readout) into plain modules."""
        return cls(TextFeedForward.from_bert(readout.last_layer), readout.head, readout.pooling)

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        h = self.feed_forward(x)  # [R, L, D] = last_hidden_state
        if self.cls_pooling:
            pooled = h[:, 0]  # [R, D]
        elif key_padding_mask is None:
            pooled = h.mean(dim=1)  # [R, D]
        else:
            real = key_padding_mask.to(h.dtype).unsqueeze(-1)  # [R, L, 1]
            pooled = (h * real).sum(dim=1) / real.sum(dim=1).clamp_min(1.0)  # [R, D]
        return self.head(pooled)  # [R, C]


class TextDirector(nn.Module):
    """Artifact-contract text model: ``forward(input_ids, attention_mask, n_samples) -> [S, B, C]`` logits and
    ``sample_rows(input_ids, attention_mask, repeats) -> [sum(repeats), C]``."""

    def __init__(self, embedding: TokenEmbedding, rollout: StochasticRollout, readout: TextReadout,
                 prefix: TextPrefix | None = None) -> None:
        super().__init__()
        self.embedding = embedding
        self.prefix = prefix if prefix is not None else TextPrefix([], [])
        self.rollout = rollout
        self.readout = readout

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
        """``sample_rows`` and the kernel error of every input [B] in one forward (needs the teacher transitions)."""
        mask = attention_mask > 0  # [B, L] True for real tokens
        x_start = self.prefix(self.embedding(input_ids), mask)  # [B, L, D] deterministic, once per input
        x_t, error = self.rollout.forward_scored(x_start, repeats, mask)  # [R, L, D], [B]
        row_mask = torch.repeat_interleave(mask, repeats, dim=0, output_size=x_t.shape[0])  # [R, L]
        return self.readout(x_t, row_mask), error  # [R, C], [B]

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


class FoldedConditioning(nn.Module):
    """Stands in for the kernel's step embedder and adaLN MLP once their output is folded into the rollout's
    per-step buffer: the artifact carries [T, 8D] numbers instead of their weights (1.35M at MiniLM's width)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("the step conditioning of this artifact is folded into rollout.step_modulation")


def restore_embedding(embedding: TokenEmbedding, table_dtype: str | None, max_positions: int | None
                      ) -> TokenEmbedding:
    """``embedding`` with its word table re-stored as ``table_dtype`` (None: unchanged) and the position table cut to
    ``max_positions`` (None: all of it)."""
    if (table_dtype is None or table_dtype == embedding.table_dtype) and max_positions is None:
        return embedding
    if embedding.quantized:
        raise ValueError("cannot re-store an int8 table")
    position = embedding.position if max_positions is None else embedding.position[:max_positions]
    return TokenEmbedding(embedding.word_table.float(), position, embedding.segment, embedding.norm,
                          table_dtype or embedding.table_dtype)


def fold_for_artifact(director: TextDirector, table_dtype: str | None = None, max_positions: int | None = None,
                      layer_dtype: str = "float32") -> TextDirector:
    """A copy for export, in eval mode: the adaLN modulation folded into per-step buffers and its MLPs dropped; the
    word table re-stored as ``table_dtype`` (default: unchanged), the position table cut to ``max_positions`` and,
    with ``layer_dtype`` float16, the linear layers of the prefix, the teacher transitions (if any) and the readout
    stored in half precision."""
    folded = copy.deepcopy(director).eval().requires_grad_(False)  # an inference artifact
    folded.embedding = restore_embedding(folded.embedding, table_dtype, max_positions)
    if layer_dtype == "float16":
        store_linears_in_half(folded.prefix)
        store_linears_in_half(folded.rollout.teacher)
        store_linears_in_half(folded.readout.feed_forward)
    elif layer_dtype != "float32":
        raise ValueError(f"layer_dtype must be float32 or float16, got {layer_dtype!r}")
    folded.rollout.fold_conditioning()
    folded.rollout.kernel.t_embedder = FoldedConditioning()
    folded.rollout.kernel.adaLN_modulation = FoldedConditioning()
    return folded


class TextBackbone(nn.Module):
    """The plain fine-tuned encoder under the artifact contract (the deterministic baseline served beside DIRECTOR):
    embedding, all T transitions as the prefix, readout; every sample row of an input is the same logit vector."""

    def __init__(self, embedding: TokenEmbedding, prefix: TextPrefix, readout: TextReadout) -> None:
        super().__init__()
        self.embedding = embedding
        self.prefix = prefix
        self.readout = readout

    @classmethod
    def from_view(cls, view: BertTransitionView, table_dtype: str = "float32", max_positions: int | None = None,
                  layer_dtype: str = "float32") -> TextBackbone:
        embedding = TokenEmbedding.from_bert(view.embedding.embeddings, table_dtype, max_positions)
        module = cls(embedding, view.prefix(view.num_steps), TextReadout.from_bert(view.readout_head)).eval()
        if layer_dtype == "float16":
            store_linears_in_half(module.prefix)
            store_linears_in_half(module.readout.feed_forward)
        return module.requires_grad_(False)

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
