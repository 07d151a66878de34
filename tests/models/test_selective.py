"""Selective prediction by Learn then Test: the binomial tail against scipy's, the guarantee over many calibration
draws, and the case where no threshold meets the risk."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import binom

from models.selective import binomial_cdf, learn_then_test


def test_the_binomial_tail_matches_scipy() -> None:
    k = torch.tensor([0, 3, 10, 50, 200])
    n = torch.tensor([10, 40, 100, 500, 1000])
    for p in (0.01, 0.05, 0.3):
        assert binomial_cdf(k, n, p).tolist() == pytest.approx(binom.cdf(k.numpy(), n.numpy(), p).tolist(),
                                                               rel=1e-9, abs=1e-12)


def confidences(n: int, gen: torch.Generator) -> torch.Tensor:
    """A classifier's confidences as they usually are: most near 1, a tail down to 0.5 ([n], 1 - 0.5 u^4)."""
    return 1.0 - 0.5 * torch.rand(n, generator=gen, dtype=torch.float64) ** 4


def calibration_draw(n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Confidences and whether each prediction was right, right with probability equal to the confidence."""
    confidence = confidences(n, gen)  # [n]
    correct = torch.rand(n, generator=gen, dtype=torch.float64) < confidence  # [n]
    return confidence, correct


POPULATION = confidences(2_000_000, torch.Generator().manual_seed(99)).sort().values  # for the true selective risk
# the summed error (1 - c) of the population from each position of the sorted confidences up: [N + 1], 0 past the end
TAIL_ERRORS = torch.cat([(1.0 - POPULATION).flip(0).cumsum(0).flip(0), torch.zeros(1, dtype=torch.float64)])


def true_selective_risk(threshold: float) -> float:
    """The error rate among inputs answered at ``threshold`` for the calibrated model above: E[1 - c | c >= t] (the
    answered inputs are the sorted population's tail from the first c >= t; NaN when none is answered)."""
    first = int(torch.searchsorted(POPULATION, torch.tensor([threshold], dtype=torch.float64))[0])
    answered = len(POPULATION) - first
    return float(TAIL_ERRORS[first] / answered) if answered else float("nan")


@pytest.mark.parametrize("max_risk", [0.02, 0.05, 0.1])
def test_the_risk_guarantee_holds_over_calibration_draws(max_risk: float) -> None:
    delta, gen = 0.1, torch.Generator().manual_seed(0)
    chosen = [learn_then_test(*calibration_draw(1000, gen), max_risk, delta) for _ in range(300)]
    violations = sum(t.threshold is not None and true_selective_risk(t.threshold) > max_risk for t in chosen)
    assert violations / len(chosen) <= delta  # at most delta of the draws choose a threshold whose risk is too high
    answered = [t.answered / t.n for t in chosen if t.threshold is not None]
    assert len(answered) >= 0.9 * len(chosen)  # not vacuous: nearly every draw answers, and a good share of inputs
    assert sum(answered) / len(answered) > 0.3


def test_every_input_abstains_when_no_threshold_meets_the_risk() -> None:
    confidence = torch.linspace(0.6, 0.99, 200, dtype=torch.float64)
    wrong = torch.zeros(200, dtype=torch.bool)  # every prediction wrong
    chosen = learn_then_test(confidence, wrong, 0.05, 0.1)
    assert chosen.threshold is None and chosen.answered == 0 and chosen.n == 200


def test_a_threshold_answers_every_input_tied_with_it() -> None:
    confidence = torch.tensor([0.9, 0.9, 0.9, 0.9, 0.5, 0.5], dtype=torch.float64)
    correct = torch.tensor([True, True, True, True, False, False])
    chosen = learn_then_test(confidence, correct, 0.5, 0.2)
    # 0.9 answers the four ties (0 errors: p = 0.5^4 = 0.0625 <= 0.2); 0.5 answers all six (2 errors: p = 0.34 > 0.2)
    assert (chosen.threshold, chosen.answered, chosen.errors) == (0.9, 4, 0)
    with pytest.raises(ValueError, match="max_risk and delta"):
        learn_then_test(confidence, correct, 0.0, 0.1)
