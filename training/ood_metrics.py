"""OOD detection metrics, one fixed convention: OOD is the positive class and a higher score means more OOD.

Every function takes the scores of in-distribution inputs (``id_scores [N_id]``) and of OOD inputs
(``ood_scores [N_ood]``) and returns a Python float. An input passes (is accepted as in-distribution)
when its score is <= the threshold; ``threshold_at_tpr`` is the one threshold rule, the same the
exported manifest and the server use.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from scipy.stats import rankdata
from sklearn.metrics import average_precision_score

OOD_CONVENTION = "OOD is the positive class; a higher score means more OOD; an input passes when score <= threshold"


def _scores_and_truth(id_scores: torch.Tensor, ood_scores: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Concatenated scores (float64) and truth (1 = OOD)."""
    scores = torch.cat([id_scores.detach().reshape(-1).double().cpu(), ood_scores.detach().reshape(-1).double().cpu()])
    truth = np.concatenate([np.zeros(id_scores.numel()), np.ones(ood_scores.numel())])
    return scores.numpy(), truth


def auroc(id_scores: torch.Tensor, ood_scores: torch.Tensor) -> float:
    """Area under the ROC curve of separating OOD (positive) from ID by the score (ties count one half): the
    Mann-Whitney statistic over average ranks, which is what ``sklearn.metrics.roc_auc_score`` computes (a test
    checks they agree) without its input checks, most of its time at the thousands of calls an export makes."""
    n_id, n_ood = id_scores.numel(), ood_scores.numel()
    if n_id == 0 or n_ood == 0:
        raise ValueError(f"AUROC needs inputs of both kinds, got {n_id} in-distribution and {n_ood} OOD")
    scores, _ = _scores_and_truth(id_scores, ood_scores)
    ood_ranks = float(rankdata(scores)[n_id:].sum())  # average ranks: a tie counts one half
    return (ood_ranks - n_ood * (n_ood + 1) / 2) / (n_id * n_ood)


def aupr_out(id_scores: torch.Tensor, ood_scores: torch.Tensor) -> float:
    """Area under the precision-recall curve with OOD as the positive class (average precision)."""
    scores, truth = _scores_and_truth(id_scores, ood_scores)
    return float(average_precision_score(truth, scores))


def aupr_in(id_scores: torch.Tensor, ood_scores: torch.Tensor) -> float:
    """Area under the precision-recall curve with ID as the positive class, ranked by the negated score."""
    scores, truth = _scores_and_truth(id_scores, ood_scores)
    return float(average_precision_score(1.0 - truth, -scores))


def threshold_at_tpr(id_scores: torch.Tensor, tpr: float = 0.95) -> float:
    """Threshold such that a fraction ``tpr`` of in-distribution inputs has score <= threshold (passes)."""
    return float(torch.quantile(id_scores.detach().reshape(-1).double().cpu(), tpr))


def fpr_at_tpr(id_scores: torch.Tensor, ood_scores: torch.Tensor, tpr: float = 0.95) -> float:
    """Fraction of OOD inputs that pass (score <= threshold) at the threshold that lets ``tpr`` of the ID
    inputs pass. "TPR" is the in-distribution pass rate, as in the OOD literature's FPR95 (there ID is
    the positive class of that one number, even though OOD is the positive class of the AUROC here)."""
    threshold = threshold_at_tpr(id_scores, tpr)
    return float((ood_scores.detach().reshape(-1).double().cpu() <= threshold).double().mean())


def ood_report(id_scores: torch.Tensor, ood_scores: torch.Tensor) -> dict[str, float]:
    """AUROC, AUPR-In, AUPR-Out and FPR at 95% ID pass rate."""
    return {
        "auroc": auroc(id_scores, ood_scores), "aupr_in": aupr_in(id_scores, ood_scores),
        "aupr_out": aupr_out(id_scores, ood_scores), "fpr95": fpr_at_tpr(id_scores, ood_scores, 0.95),
    }


def paired_ood_interval(fn: Callable[[torch.Tensor, torch.Tensor], float], id_a: torch.Tensor, ood_a: torch.Tensor,
                        id_b: torch.Tensor, ood_b: torch.Tensor, n_boot: int, seed: int) -> tuple[float, float]:
    """The 95% interval of ``fn(id_a, ood_a) - fn(id_b, ood_b)`` (an OOD metric of two paths' scores of the same
    inputs) over paired resamples."""
    return bootstrap_interval(lambda i, j: fn(id_a[i], ood_a[j]) - fn(id_b[i], ood_b[j]), id_a.shape[0],
                              ood_a.shape[0], n_boot, seed)


def bootstrap_interval(statistic: Callable[[torch.Tensor, torch.Tensor], float], n_id: int, n_ood: int,
                       n_boot: int, seed: int) -> tuple[float, float]:
    """The 95% percentile interval of ``statistic(id_index, ood_index)`` over resamples of both index sets (the same
    resample for both paths inside ``statistic``: paired)."""
    gen = torch.Generator().manual_seed(seed)
    draws = []
    for _ in range(n_boot):
        draws.append(statistic(torch.randint(0, n_id, (n_id,), generator=gen),
                               torch.randint(0, max(n_ood, 1), (n_ood,), generator=gen)))
    values = torch.tensor(draws, dtype=torch.float64)
    return float(values.quantile(0.025)), float(values.quantile(0.975))
