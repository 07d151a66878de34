"""The post-hoc path: the backbone's own forward under the artifact contract, with the feature-space scores its
export fitted, and no kernel (docs/method.md, "The kernel earns its place, or steps aside").

An export builds it from the DIRECTOR artifact module it has already assembled: the same embedding, the same
deterministic prefix, the backbone's own last K transitions (which that module carries for the kernel error) in
place of the sampled rollout, the backbone's readout and the same ``FeatureScorer``. So the post-hoc path is the
plain backbone plus the served scores, and its features are exactly the ones DIRECTOR's feature scores read.

- ``sample_rows(inputs..., repeats [B]) -> [sum(repeats), C]``: each input's logits repeated (every sample is the
  same row; mutual information is 0)
- ``scored_rows(inputs..., repeats) -> (rows, scores [B, F])``: the feature scores, named in order by the
  manifest's ``artifact.input_scores`` (no kernel error: there is no kernel)
- ``forward(inputs..., n_samples) -> [S, B, C]``

The logits come from the features through the readout's final linear layer (``final_layer``), so the readout's
last sublayer and pooling run once for both.
"""

from __future__ import annotations

import torch
from torch import nn

from models.director import NoFeatureScores, row_count
from models.text_director import TextDirector


class PosthocCore(nn.Module):
    """Embedding, prefix, the backbone's last transitions and the readout's features, then its final layer."""

    def __init__(self, embedding: nn.Module, prefix: nn.Module, transitions: nn.ModuleList, readout: nn.Module,
                 feature_scorer: nn.Module | None = None) -> None:
        super().__init__()
        self.embedding = embedding
        self.prefix = prefix
        self.transitions = transitions
        self.readout = readout
        self.feature_scorer = feature_scorer if feature_scorer is not None else NoFeatureScores()
        weight, bias = readout.final_layer()
        self.register_buffer("head_weight", weight.detach().float().clone())  # [C, D']
        self.register_buffer("head_bias", bias.detach().float().clone())  # [C]

    def features(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """X_0 [B, N, D] -> the penultimate features [B, D'] along the backbone's own trajectory."""
        x = self.prefix(x, mask)  # [B, N, D] X_{T-K}
        for transition in self.transitions:
            x = transition(x, mask)  # [B, N, D] the backbone's next state
        return self.readout.features(x, mask).float()  # [B, D']

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        return features @ self.head_weight.T + self.head_bias  # [B, C]


def repeated(logits: torch.Tensor, repeats: torch.Tensor) -> torch.Tensor:
    """[B, C] -> [sum(repeats), C], each input's row repeated, grouped by input."""
    return torch.repeat_interleave(logits, repeats, dim=0, output_size=row_count(repeats))  # [R, C]


class PosthocImage(PosthocCore):
    """The image side of the contract: ``pixels [B, C, H, W]`` in [0, 1]."""

    @torch.jit.export
    def sample_rows(self, pixels: torch.Tensor, repeats: torch.Tensor) -> torch.Tensor:
        return repeated(self.logits(self.features(self.embedding(pixels), None)), repeats)  # [R, C]

    @torch.jit.export
    def scored_rows(self, pixels: torch.Tensor, repeats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.features(self.embedding(pixels), None)  # [B, D']
        return repeated(self.logits(features), repeats), self.feature_scorer(features).float()  # [R, C], [B, F]

    def forward(self, pixels: torch.Tensor, n_samples: int) -> torch.Tensor:
        logits = self.logits(self.features(self.embedding(pixels), None))  # [B, C]
        return logits.unsqueeze(0).expand(n_samples, -1, -1)  # [S, B, C]


class PosthocText(PosthocCore):
    """The text side of the contract: right-padded ``input_ids`` and ``attention_mask`` [B, L] int64."""

    @torch.jit.export
    def sample_rows(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, repeats: torch.Tensor
                    ) -> torch.Tensor:
        mask = attention_mask > 0  # [B, L] True for real tokens
        return repeated(self.logits(self.features(self.embedding(input_ids), mask)), repeats)  # [R, C]

    @torch.jit.export
    def scored_rows(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, repeats: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        mask = attention_mask > 0  # [B, L]
        features = self.features(self.embedding(input_ids), mask)  # [B, D']
        return repeated(self.logits(features), repeats), self.feature_scorer(features).float()  # [R, C], [B, F]

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, n_samples: int) -> torch.Tensor:
        mask = attention_mask > 0  # [B, L]
        logits = self.logits(self.features(self.embedding(input_ids), mask))  # [B, C]
        return logits.unsqueeze(0).expand(n_samples, -1, -1)  # [S, B, C]


def posthoc_from_director(director: nn.Module) -> PosthocCore:
    """The post-hoc path of a DIRECTOR artifact module (image or text) whose rollout carries the backbone's own last
    K transitions: the same embedding, prefix, transitions, readout and feature scorer (shared, not copied)."""
    rollout = director.rollout
    if not rollout.has_teacher:
        raise ValueError("the post-hoc path needs the backbone's own last transitions (an export's scored module)")
    kind = PosthocText if isinstance(director, TextDirector) else PosthocImage
    return kind(director.embedding, director.prefix, rollout.teacher, director.readout,
                director.feature_scorer).eval()
