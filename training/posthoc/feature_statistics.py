"""The feature-space OOD scores' statistics for an artifact (``models.feature_scores``), fitted on the training split
only: the backbone's own penultimate features, read the way the artifact reads them at inference (the deterministic
prefix, then the backbone's own last K transitions, which the artifact carries for the kernel error, then the
readout's pooling and any dense layer before the final linear one). Fitting on the artifact module itself means the
statistics see its stored precisions (a float16 layer, an int8 word table) exactly as served."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from models.feature_scores import FEATURE_SCORES, FeatureScorer, fit_feature_scorer, served_scores
from training.data.images import key_padding
from training.loading import AnySplit


@torch.no_grad()
def backbone_features(model: nn.Module, split: AnySplit, chunk: int = 256) -> torch.Tensor:
    """The penultimate features [N, D'] of every input of ``split`` along the backbone's own trajectory (``model``: a
    DIRECTOR whose rollout carries the teacher transitions)."""

    def features(*args: torch.Tensor) -> torch.Tensor:
        mask = key_padding(args)  # [b, L] or None
        x = model.prefix(model.embedding(args[0]), mask)  # [b, N, D] X_{T-K}
        for transition in model.rollout.teacher:
            x = transition(x, mask)  # [b, N, D] the backbone's next state
        return model.readout.features(x, mask).float().cpu()  # [b, D']

    return split.map(features, chunk)  # [N, D']


def attach_feature_scores(model: nn.Module, train: AnySplit, num_classes: int, seed: int, knn_bank: int) -> None:
    """Fit the statistics on ``train`` and set them as ``model.feature_scorer``, so that its ``scored_rows`` returns
    the feature scores beside the kernel error. Multi-label labels ([N, C] indicators) name no one class per input:
    the statistics then hold one mean, the training features' (``mds`` is the Mahalanobis distance to it, under the
    features' own covariance, and ``rmds`` is 0); KNN and ViM read no classes."""
    features = backbone_features(model, train)  # [N, D']
    weight, bias = model.readout.final_layer()
    labels, classes = (train.labels, num_classes) if train.labels.dim() == 1 else \
        (torch.zeros(len(train), dtype=torch.long), 1)  # [N]
    model.feature_scorer = fit_feature_scorer(features, labels, classes, weight.float(), bias.float(), seed,
                                              bank_size=knn_bank)


def keep_scores(model: nn.Module, names: Iterable[str]) -> bool:
    """Let ``model``'s feature scorer compute only the feature scores among ``names`` (``FeatureScorer.keep``);
    whether that changed what its ``scored_rows`` returns."""
    scorer = getattr(model, "feature_scorer", None)
    wanted = set(names)
    kept = [name for name in FEATURE_SCORES if name in wanted]
    if not isinstance(scorer, FeatureScorer) or tuple(kept) == served_scores(scorer):
        return False
    scorer.keep(kept)
    return True
