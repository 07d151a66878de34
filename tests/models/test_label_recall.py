"""Label sets with a recall guarantee (``models.label_recall``): the threshold conformal risk control gives, worked
by hand, and its guarantee checked over many random calibration and test draws."""

from __future__ import annotations

import math

import pytest
import torch

from models.label_recall import RecallTable, recall_figures

PROBS = torch.tensor([[0.9, 0.2, 0.6], [0.3, 0.8, 0.1], [0.7, 0.4, 0.5], [0.2, 0.1, 0.3]])
TRUTH = torch.tensor([[1, 0, 1], [0, 1, 0], [1, 1, 0], [0, 0, 0]])  # the last input has no true label


def test_the_table_holds_each_true_label_weighted_by_its_input() -> None:
    table = RecallTable.fit(PROBS, TRUTH)
    assert table.n == 4
    assert table.probabilities.tolist() == pytest.approx([0.4, 0.6, 0.7, 0.8, 0.9])
    assert table.weights.tolist() == pytest.approx([0.5, 0.5, 0.5, 1.0, 0.5])


@pytest.mark.parametrize(("coverage", "expected"), [
    (0.81, 0.0),  # budget 0.19 * 5 - 1 < 0: no threshold passes, every label is kept
    (0.8, 0.4),  # budget 0: nothing may be missed, the smallest true probability is the threshold
    (0.6, 0.7),  # budget 1.0: the 0.4 and the 0.6 (0.5 each) may be missed, not the 0.7 too
    (0.5, 0.8),  # budget 1.5: the 0.7 may go too (1.5), not the 0.8 (weight 1)
    (0.1, math.inf),  # budget 3.5 covers all five entries (3.0): no label is needed
])
def test_the_threshold_is_the_largest_the_budget_allows(coverage: float, expected: float) -> None:
    """Entries ascending 0.4, 0.6, 0.7, 0.8, 0.9 weighing 0.5, 0.5, 0.5, 1, 0.5 (n = 4): the summed loss of the
    entries below the threshold may reach (1 - coverage)(n + 1) - 1."""
    table = RecallTable.fit(PROBS, TRUTH)
    lam = table.threshold(coverage)
    assert lam == pytest.approx(expected)
    budget = (1 - coverage) * 5 - 1
    if 0 < lam < math.inf:  # within the budget, and one step higher would miss the entry at lam too, past it
        missed = float(table.weights[table.probabilities < lam].sum())
        assert missed <= budget + 1e-9 < missed + float(table.weights[table.probabilities == lam].sum())


def test_sets_keep_the_labels_at_or_above_the_threshold_most_probable_first() -> None:
    table = RecallTable.fit(PROBS, TRUTH)
    assert table.sets(PROBS, 0.6) == [[0], [1], [0], []]  # lam = 0.7
    assert table.sets(PROBS, 0.81) == [[0, 2, 1], [1, 0, 2], [0, 2, 1], [2, 0, 1]]  # lam = 0: every label


def test_a_coverage_out_of_range_is_refused() -> None:
    with pytest.raises(ValueError, match="coverage"):
        RecallTable.fit(PROBS, TRUTH).threshold(1.0)


def synthetic(count: int, labels: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Calibrated probabilities (each label drawn with its own probability), so the sets are neither trivial nor
    empty."""
    probs = torch.rand(count, labels, generator=generator) ** 2  # [N, K] mostly small, as real labels are
    return probs, (torch.rand(count, labels, generator=generator) < probs).long()


@pytest.mark.parametrize("coverage", [0.8, 0.9])
def test_the_expected_recall_reaches_the_coverage_over_random_draws(coverage: float) -> None:
    """E[recall] >= coverage over calibration and test draws, and the sets are not every label: the mean over 300
    draws of 150 calibration and 150 test inputs sits within three standard errors above the target, not far above
    it, with sets well under the 6 labels."""
    generator = torch.Generator().manual_seed(0)
    recalls, sizes = [], []
    for _ in range(300):
        probs, truth = synthetic(300, 6, generator)
        table = RecallTable.fit(probs[:150], truth[:150])
        figures = recall_figures(table.sets(probs[150:], coverage), truth[150:])
        recalls.append(figures["recall"])
        sizes.append(figures["mean_size"])
    mean, spread = torch.tensor(recalls).mean().item(), torch.tensor(recalls).std().item() / math.sqrt(len(recalls))
    assert mean >= coverage - 3 * spread
    assert mean <= coverage + 0.03
    assert sum(sizes) / len(sizes) < 5


def test_recall_figures_count_an_input_without_labels_as_fully_recalled() -> None:
    figures = recall_figures([[0], [0], [0, 1], []], TRUTH)
    assert figures["recall"] == pytest.approx((0.5 + 0 + 1 + 1) / 4)
    assert figures["mean_size"] == pytest.approx(1.0)
