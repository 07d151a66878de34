"""The decoder artifact: DIRECTOR on a Qwen2 / Llama classifier as plain, scriptable modules (docs/method.md;
the contract: docs/architecture.md).

``DecoderDirector`` has the text artifact's contract (``models.text_director.TextDirector``) on the decoder's own
parts (``models.decoder_layers``): the token table, the deterministic prefix (the first T - K transitions, once per
input), ``StochasticRollout`` over the last K steps with a causal kernel (``TransitionKernel(..., causal=True)``) and
the readout (last MLP sublayer, final RMSNorm, last real token, score head):

- ``forward(input_ids [B, L] int64, attention_mask [B, L] int64, n_samples) -> logits [S, B, C]``
- ``sample_rows(input_ids, attention_mask, repeats [B] int64) -> logits [sum(repeats), C]``, rows grouped by input
- ``scored_rows(input_ids, attention_mask, repeats) -> (logits [sum(repeats), C], kernel error [B])``

Inputs are right-padded (a text's tokens start at position 0). Padding changes nothing for the real tokens: attention
is causal and masks padding keys, and the readout reads the last real token.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from models.decoder_layers import DecoderEmbedding, DecoderPrefix, DecoderReadout
from models.decoder_view import DecoderTransitionView
from models.director import StochasticRollout
from models.half_storage import store_linears_in_half
from models.kernel import TransitionKernel
from models.text_director import FoldedConditioning


class DecoderDirector(nn.Module):
    """Artifact-contract decoder model: ``forward(input_ids, attention_mask, n_samples) -> [S, B, C]`` logits,
    ``sample_rows(input_ids, attention_mask, repeats) -> [sum(repeats), C]`` and ``scored_rows``."""

    def __init__(self, embedding: DecoderEmbedding, rollout: StochasticRollout, readout: DecoderReadout,
                 prefix: DecoderPrefix | None = None) -> None:
        super().__init__()
        if not rollout.kernel.causal:
            raise ValueError("a decoder's kernel attends causally, like its teacher: TransitionKernel(causal=True)")
        self.embedding = embedding
        self.prefix = prefix if prefix is not None else DecoderPrefix([])
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


def decoder_director_from_view(view: DecoderTransitionView, kernel: TransitionKernel,
                               readout: DecoderReadout | None = None, table_dtype: str = "float32"
                               ) -> DecoderDirector:
    """DIRECTOR on the frozen view's own embedding, prefix (the first T - K transitions, K = the kernel's steps) and
    readout, copied into plain modules (a float32 table reproduces the decoder's X_0 exactly). ``kernel`` must be
    causal."""
    embedding = DecoderEmbedding(view.embedding.word_table.float(), table_dtype)
    prefix = view.prefix(view.num_steps - kernel.num_steps)
    return DecoderDirector(embedding, StochasticRollout(kernel), copy.deepcopy(readout or view.readout_head), prefix)


def fold_decoder_for_artifact(director: DecoderDirector, table_dtype: str | None = None,
                              layer_dtype: str = "float32") -> DecoderDirector:
    """A copy for export, in eval mode (as ``models.text_director.fold_for_artifact``): the adaLN modulation folded
    into per-step buffers and its MLPs dropped; the token table re-stored as ``table_dtype`` (default: unchanged)
    and, with ``layer_dtype`` float16, the linear layers of the prefix, the teacher transitions (if any) and the
    readout's MLP sublayer stored in half precision (the score head stays float32)."""
    folded = copy.deepcopy(director).eval().requires_grad_(False)  # an inference artifact
    folded.embedding = folded.embedding.restored(table_dtype)
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


class DecoderBackbone(nn.Module):
    """The plain fine-tuned decoder under the artifact contract (the deterministic baseline served beside DIRECTOR):
    embedding, all T transitions as the prefix, readout; every sample row of an input is the same logit vector."""

    def __init__(self, embedding: DecoderEmbedding, prefix: DecoderPrefix, readout: DecoderReadout) -> None:
        super().__init__()
        self.embedding = embedding
        self.prefix = prefix
        self.readout = readout

    @classmethod
    def from_view(cls, view: DecoderTransitionView, table_dtype: str = "float32", layer_dtype: str = "float32"
                  ) -> DecoderBackbone:
        embedding = DecoderEmbedding(view.embedding.word_table.float(), table_dtype)
        module = cls(embedding, view.prefix(view.num_steps), copy.deepcopy(view.readout_head)).eval()
        if layer_dtype == "float16":
            store_linears_in_half(module.prefix)
            store_linears_in_half(module.readout.feed_forward)
        elif layer_dtype != "float32":
            raise ValueError(f"layer_dtype must be float32 or float16, got {layer_dtype!r}")
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
