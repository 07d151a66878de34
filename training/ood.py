"""OOD scoring conventions: OOD is the positive class and a higher score means more OOD."""

from __future__ import annotations

import numpy as np
import torch
from sklearn.metrics import roc_auc_score


def auroc(id_scores: torch.Tensor, ood_scores: torch.Tensor) -> float:
    scores = torch.cat([id_scores, ood_scores]).numpy()
    truth = np.concatenate([np.zeros(len(id_scores)), np.ones(len(ood_scores))])
    return float(roc_auc_score(truth, scores))


def threshold_at_tpr(id_scores: torch.Tensor, tpr: float = 0.95) -> float:
    """Threshold such that a fraction ``tpr`` of in-distribution inputs has score <= threshold (passes)."""
    return float(torch.quantile(id_scores.double(), tpr))
