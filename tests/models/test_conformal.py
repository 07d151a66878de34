"""Split conformal sets: the same sets as MAPIE (a maintained implementation) on the same calibration data, the
coverage the guarantee promises on exchangeable data, and the class-conditional variant's coverage per class."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from mapie.classification import SplitConformalClassifier
from mapie.conformity_scores import APSConformityScore
from sklearn.base import BaseEstimator, ClassifierMixin

from models.conformal import ConformalTable, ScoreRule, conformal_threshold, label_scores, true_label_scores


class GivenProbabilities(ClassifierMixin, BaseEstimator):
    """A fitted classifier whose inputs are already its probabilities (MAPIE's prefit mode reads predict_proba)."""

    def fit(self, x: np.ndarray, y: np.ndarray) -> GivenProbabilities:
        self.classes_ = np.arange(x.shape[1])
        return self

    def predict_proba(self, x: np.ndarray) -> np.ndarray:
        return x

    def predict(self, x: np.ndarray) -> np.ndarray:
        return x.argmax(axis=1)


def sampled(n: int, classes: int, seed: int, sharpness: float = 3.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Probabilities [n, C] and labels [n] drawn from them: a calibrated classifier, so coverage is testable."""
    gen = torch.Generator().manual_seed(seed)
    probs = torch.softmax(sharpness * torch.randn(n, classes, generator=gen, dtype=torch.float64), dim=1)  # [n, C]
    labels = torch.multinomial(probs, 1, generator=gen).squeeze(1)  # [n]
    return probs, labels


@pytest.mark.parametrize("coverage", [0.8, 0.9, 0.95])
def test_lac_sets_match_mapie(coverage: float) -> None:
    calibration, cal_labels = sampled(500, 6, seed=0)
    test, _ = sampled(300, 6, seed=1)
    ours = ConformalTable.fit(calibration, cal_labels, ScoreRule("lac")).sets(test, coverage)
    mapie = SplitConformalClassifier(GivenProbabilities().fit(calibration.numpy(), cal_labels.numpy()),
                                     confidence_level=coverage, conformity_score="lac", prefit=True)
    mapie.conformalize(calibration.numpy(), cal_labels.numpy())
    _, masks = mapie.predict_set(test.numpy())
    assert [set(s) for s in ours] == [set(np.flatnonzero(row[:, 0]).tolist()) for row in masks]


def test_aps_scores_are_mapies_cumulated_mass_without_its_randomisation() -> None:
    """MAPIE's APS always subtracts a uniform share of the true label's probability at calibration (randomised APS);
    the served score is the cumulated mass itself, so that a request's set is reproducible."""
    probs, labels = sampled(400, 7, seed=3)
    aps = APSConformityScore()
    aps.classes = np.arange(7)
    cumulated, _ = aps.get_true_label_cumsum_proba(labels.numpy(), probs.numpy(), np.arange(7))
    assert np.allclose(true_label_scores(probs, labels, ScoreRule("aps")).numpy(), cumulated.ravel())


def test_the_threshold_is_the_finite_sample_quantile() -> None:
    scores = torch.arange(1, 10, dtype=torch.float64) / 10  # n = 9: 0.1 .. 0.9
    assert conformal_threshold(scores, 0.8) == pytest.approx(0.8)  # ceil(10 * 0.8) = 8th smallest
    assert conformal_threshold(scores, 0.9) == pytest.approx(0.9)  # ceil(10 * 0.9) = 9th
    assert conformal_threshold(scores, 0.95) == math.inf  # 10th of 9: too few to promise it, every label
    with pytest.raises(ValueError, match="coverage"):
        conformal_threshold(scores, 1.0)


@pytest.mark.parametrize("score", ["lac", "aps", "raps"])
def test_marginal_coverage_holds_on_exchangeable_data(score: str) -> None:
    rule = ScoreRule(score, penalty=0.05, free_ranks=1) if score == "raps" else ScoreRule(score)
    for coverage in (0.8, 0.9, 0.95):
        hits = []
        for seed in range(40):  # coverage is a promise over calibration draws: average many
            probs, labels = sampled(400, 5, seed=2 * seed)
            cal, test = slice(0, 200), slice(200, 400)
            sets = ConformalTable.fit(probs[cal], labels[cal], rule).sets(probs[test], coverage)
            hits += [int(y) in s for s, y in zip(sets, labels[test], strict=True)]
        empirical = sum(hits) / len(hits)
        # at least the target (up to the sampling error of 8,000 draws) and at most target + 1/(n + 1)
        assert coverage - 0.01 <= empirical <= coverage + 1 / 201 + 0.01, (coverage, empirical)


def test_class_conditional_sets_cover_each_class() -> None:
    hits: dict[int, list[bool]] = {c: [] for c in range(3)}
    for seed in range(30):
        gen = torch.Generator().manual_seed(seed)
        probs, _ = sampled(600, 3, seed=100 + seed)
        labels = torch.where(torch.rand(600, generator=gen) < 0.2, 2, probs.argmax(1))  # class 2 often mislabelled
        table = ConformalTable.fit(probs[:300], labels[:300], ScoreRule("lac"), class_conditional=True)
        for s, y in zip(table.sets(probs[300:], 0.9), labels[300:], strict=True):
            hits[int(y)].append(int(y) in s)
    for c, got in hits.items():
        assert sum(got) / len(got) >= 0.88, (c, sum(got) / len(got))


def test_aps_scores_are_the_mass_at_or_above_the_label_and_raps_penalises_rank() -> None:
    probs = torch.tensor([[0.5, 0.3, 0.2]], dtype=torch.float64)
    assert label_scores(probs, ScoreRule("aps"))[0].tolist() == pytest.approx([0.5, 0.8, 1.0])
    assert label_scores(probs, ScoreRule("lac"))[0].tolist() == pytest.approx([0.5, 0.7, 0.8])
    raps = label_scores(probs, ScoreRule("raps", penalty=0.1, free_ranks=1))
    assert raps[0].tolist() == pytest.approx([0.5, 0.9, 1.2])  # ranks 2 and 3 pay 0.1 and 0.2
    assert true_label_scores(probs, torch.tensor([1]), ScoreRule("aps")).tolist() == pytest.approx([0.8])
    # sets are returned most probable first
    table = ConformalTable(ScoreRule("aps"), torch.tensor([0.85], dtype=torch.float64))
    assert table.sets(torch.tensor([[0.3, 0.5, 0.2]], dtype=torch.float64), 0.4) == [[1, 0]]
    with pytest.raises(ValueError, match="unknown conformal score"):
        ScoreRule("topk")
