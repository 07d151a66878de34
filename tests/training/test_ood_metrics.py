"""OOD metrics of training/ood_metrics.py against scikit-learn, brute-force counts and hand-made cases."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import average_precision_score, roc_auc_score

from training.ood_metrics import aupr_in, aupr_out, auroc, fpr_at_tpr, ood_report, threshold_at_tpr


def scores(seed: int, n_id: int = 300, n_ood: int = 200, shift: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n_id, generator=gen), torch.randn(n_ood, generator=gen) + shift


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_auroc_and_aupr_match_sklearn_with_explicit_labels(seed: int) -> None:
    id_scores, ood_scores = scores(seed)
    # explicit labels: ID first (300 zeros), OOD after (200 ones)
    y_ood = np.array([0] * 300 + [1] * 200)
    s = np.concatenate([id_scores.numpy(), ood_scores.numpy()]).astype(np.float64)
    assert auroc(id_scores, ood_scores) == pytest.approx(roc_auc_score(y_ood, s), abs=1e-12)
    assert aupr_out(id_scores, ood_scores) == pytest.approx(average_precision_score(y_ood, s), abs=1e-12)
    assert aupr_in(id_scores, ood_scores) == pytest.approx(average_precision_score(1 - y_ood, -s), abs=1e-12)


def test_auroc_counts_ties_one_half_as_sklearn_does() -> None:
    """Scores rounded to a few values: many ties within and across the two kinds."""
    gen = torch.Generator().manual_seed(4)
    id_scores = torch.randint(0, 6, (400,), generator=gen).double()
    ood_scores = torch.randint(2, 8, (150,), generator=gen).double()
    truth = np.array([0] * 400 + [1] * 150)
    expected = roc_auc_score(truth, np.concatenate([id_scores.numpy(), ood_scores.numpy()]))
    assert auroc(id_scores, ood_scores) == pytest.approx(expected, abs=1e-12)
    with pytest.raises(ValueError, match="both kinds"):
        auroc(id_scores, torch.zeros(0))


def test_perfect_and_inverted_separators() -> None:
    id_scores = torch.linspace(0.0, 1.0, 100)
    ood_scores = torch.linspace(2.0, 3.0, 50)
    report = ood_report(id_scores, ood_scores)
    assert report == {"auroc": 1.0, "aupr_in": 1.0, "aupr_out": 1.0, "fpr95": 0.0}
    # the convention: swapping the roles (OOD scored lower) inverts the AUROC and every OOD input passes
    assert auroc(ood_scores, id_scores) == 0.0
    assert fpr_at_tpr(ood_scores, id_scores) == 1.0


def test_identical_distributions_are_at_chance() -> None:
    same = torch.arange(100, dtype=torch.float64)
    assert auroc(same, same.clone()) == pytest.approx(0.5)
    assert fpr_at_tpr(same, same.clone()) == pytest.approx(0.95, abs=0.011)


@pytest.mark.parametrize(("seed", "tpr"), [(0, 0.95), (1, 0.95), (2, 0.8), (3, 0.5)])
def test_fpr_at_tpr_matches_brute_force_count(seed: int, tpr: float) -> None:
    id_scores, ood_scores = scores(seed, shift=1.5)
    threshold = threshold_at_tpr(id_scores, tpr)
    # the threshold lets (at least, up to interpolation) tpr of the ID inputs pass
    assert abs(sum(float(s) <= threshold for s in id_scores) / len(id_scores) - tpr) <= 1 / len(id_scores)
    passed = sum(1 for s in ood_scores.double().tolist() if s <= threshold)
    assert fpr_at_tpr(id_scores, ood_scores, tpr) == pytest.approx(passed / len(ood_scores), abs=1e-12)


def test_ood_report_keys_are_floats() -> None:
    report = ood_report(*scores(5))
    assert set(report) == {"auroc", "aupr_in", "aupr_out", "fpr95"}
    assert all(isinstance(v, float) and 0.0 <= v <= 1.0 for v in report.values())
    assert report["fpr95"] == fpr_at_tpr(*scores(5), 0.95)
