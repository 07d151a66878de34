"""The hybrid path: the backbone's own forward for the prediction, the DIRECTOR kernel beside it for its error
(docs/method.md, "The kernel's signal beside the exact backbone").

The kernel's value on a model can be its *error* rather than its sampled logits: where one shared block imitates the
backbone's last K transitions badly, the input is unlike what it was distilled on. The hybrid runs the backbone's own
trajectory (embedding, prefix, its last K transitions, readout) exactly as the post-hoc path does, so its logits are
the post-hoc path's to the bit, and at each of the K transitions it also runs the kernel's mean, teacher-forced on the
backbone's own state, for the kernel error. No noise is drawn: every sample row is the same.

- ``sample_rows(inputs..., repeats [B]) -> [sum(repeats), C]``: each input's logits repeated (no kernel: a request
  whose manifest reads no per-input score pays for the backbone alone)
- ``scored_rows(inputs..., repeats) -> (rows, scores [B, 1 + F])``: the kernel error, then the feature scores, named
  in order by the manifest's ``artifact.input_scores`` (``models.director.input_scores``)
- ``forward(inputs..., n_samples) -> [S, B, C]``

Its cost per input is the backbone plus K kernel blocks, whatever the sample count.
"""

from __future__ import annotations

import torch
from torch import nn

from models.director import NoFeatureScores, StochasticRollout, input_scores
from models.posthoc import repeated
from models.text_director import TextDirector


class HybridCore(nn.Module):
    """Embedding, prefix, and the rollout's teacher (the backbone's own last K transitions) with its kernel beside
    them; the readout's features, then its final layer."""

    def __init__(self, embedding: nn.Module, prefix: nn.Module, rollout: StochasticRollout, readout: nn.Module,
                 feature_scorer: nn.Module | None = None) -> None:
        super().__init__()
        if not rollout.has_teacher:
            raise ValueError("the hybrid path needs the backbone's own last transitions (an export's scored module)")
        self.embedding = embedding
        self.prefix = prefix
        self.rollout = rollout
        self.readout = readout
        self.feature_scorer = feature_scorer if feature_scorer is not None else NoFeatureScores()
        weight, bias = readout.final_layer()
        self.register_buffer("head_weight", weight.detach().float().clone())  # [C, D']
        self.register_buffer("head_bias", bias.detach().float().clone())  # [C]

    def backbone_features(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """X_0 [B, N, D] -> the penultimate features [B, D'] along the backbone's own trajectory, no kernel."""
        x = self.prefix(x, mask)  # [B, N, D] X_{T-K}
        for transition in self.rollout.teacher:
            x = transition(x, mask)  # [B, N, D] the backbone's next state
        return self.readout.features(x, mask).float()  # [B, D']

    def scored_features(self, x: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """X_0 [B, N, D] -> (the penultimate features [B, D'], the kernel error [B]): the same trajectory, with the
        kernel's mean at each step teacher-forced on the backbone's state (``StochasticRollout.kernel_error``)."""
        x = self.prefix(x, mask)  # [B, N, D] X_{T-K}
        first_mean, _ = self.rollout.step(x, 1, mask)  # [B, N, D]
        error, end = self.rollout.kernel_error(x, first_mean, mask)  # [B], [B, N, D] the backbone's own X_T
        return self.readout.features(end, mask).float(), error  # [B, D'], [B]

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        return features @ self.head_weight.T + self.head_bias  # [B, C]

    def rows_and_scores(self, features: torch.Tensor, error: torch.Tensor, repeats: torch.Tensor
                        ) -> tuple[torch.Tensor, torch.Tensor]:
        scores = input_scores(error, self.feature_scorer(features))  # [B, 1 + F]
        return repeated(self.logits(features), repeats), scores  # [R, C], [B, 1 + F]


class HybridImage(HybridCore):
    """The image side of the contract: ``pixels [B, C, H, W]`` in [0, 1]."""

    @torch.jit.export
    def sample_rows(self, pixels: torch.Tensor, repeats: torch.Tensor) -> torch.Tensor:
        return repeated(self.logits(self.backbone_features(self.embedding(pixels), None)), repeats)  # [R, C]

    @torch.jit.export
    def scored_rows(self, pixels: torch.Tensor, repeats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features, error = self.scored_features(self.embedding(pixels), None)  # [B, D'], [B]
        return self.rows_and_scores(features, error, repeats)  # [R, C], [B, 1 + F]

    def forward(self, pixels: torch.Tensor, n_samples: int) -> torch.Tensor:
        logits = self.logits(self.backbone_features(self.embedding(pixels), None))  # [B, C]
        return logits.unsqueeze(0).expand(n_samples, -1, -1)  # [S, B, C]


class HybridText(HybridCore):
    """The text side of the contract: right-padded ``input_ids`` and ``attention_mask`` [B, L] int64."""

    @torch.jit.export
    def sample_rows(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, repeats: torch.Tensor
                    ) -> torch.Tensor:
        mask = attention_mask > 0  # [B, L] True for real tokens
        return repeated(self.logits(self.backbone_features(self.embedding(input_ids), mask)), repeats)  # [R, C]

    @torch.jit.export
    def scored_rows(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, repeats: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        mask = attention_mask > 0  # [B, L]
        features, error = self.scored_features(self.embedding(input_ids), mask)  # [B, D'], [B]
        return self.rows_and_scores(features, error, repeats)  # [R, C], [B, 1 + F]

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, n_samples: int) -> torch.Tensor:
        mask = attention_mask > 0  # [B, L]
        logits = self.logits(self.backbone_features(self.embedding(input_ids), mask))  # [B, C]
        return logits.unsqueeze(0).expand(n_samples, -1, -1)  # [S, B, C]


def hybrid_from_director(director: nn.Module) -> HybridCore:
    """The hybrid path of a DIRECTOR artifact module (image or text) whose rollout carries the backbone's own last K
    transitions: the same embedding, prefix, rollout (its kernel and teacher), readout and feature scorer (shared, not
    copied)."""
    kind = HybridText if isinstance(director, TextDirector) else HybridImage
    return kind(director.embedding, director.prefix, director.rollout, director.readout,
                director.feature_scorer).eval()
