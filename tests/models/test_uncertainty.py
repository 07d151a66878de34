import math

import numpy as np
import pytest
import torch

from models.uncertainty import (
    COMBINED,
    KERNEL_ERROR,
    OOD_SCORES,
    ScoreTemperature,
    ScoreTerm,
    needs_input_scores,
    ood_score,
    split_rows,
    summarize,
)


def test_summaries_match_numpy_reference() -> None:
    torch.manual_seed(0)
    logits = torch.randn(6, 4, 5) * 3
    s = summarize(logits)
    p_s = np.exp(logits.numpy()) / np.exp(logits.numpy()).sum(-1, keepdims=True)
    p = p_s.mean(0)
    h = -(p * np.log(p)).sum(-1)
    eh = (-(p_s * np.log(p_s)).sum(-1)).mean(0)
    np.testing.assert_allclose(s.probabilities.numpy(), p, rtol=1e-5)
    np.testing.assert_allclose(s.predictive_entropy.numpy(), h, rtol=1e-5)
    np.testing.assert_allclose(s.expected_entropy.numpy(), eh, rtol=1e-5)
    np.testing.assert_allclose(s.mutual_information.numpy(), np.maximum(h - eh, 0), atol=1e-6)
    np.testing.assert_allclose(s.confidence.numpy(), p.max(-1), rtol=1e-6)
    energy = (-np.log(np.exp(logits.numpy()).sum(-1))).mean(0)
    np.testing.assert_allclose(s.energy.numpy(), energy, rtol=1e-5)


def test_mutual_information_zero_at_one_sample_and_nonnegative() -> None:
    logits = torch.randn(1, 8, 3)
    assert bool((summarize(logits).mutual_information == 0).all())
    same = torch.randn(1, 8, 3).expand(16, -1, -1)  # identical samples: MI is 0 up to rounding
    assert float(summarize(same).mutual_information.max()) < 1e-6
    assert bool((summarize(torch.randn(16, 8, 3)).mutual_information >= 0).all())


def test_disagreeing_samples_have_high_mutual_information() -> None:
    logits = torch.tensor([[[20.0, 0.0]], [[0.0, 20.0]]])  # two confident, opposite samples
    s = summarize(logits)
    assert math.isclose(float(s.mutual_information[0]), math.log(2), rel_tol=1e-4)
    assert float(s.expected_entropy[0]) < 1e-6


def test_temperature_divides_every_sample() -> None:
    logits = torch.randn(4, 3, 6)
    torch.testing.assert_close(summarize(logits, temperature=2.0).probabilities, summarize(logits / 2).probabilities)


def test_extreme_logits_stay_finite() -> None:
    s = summarize(torch.tensor([[[1e4, -1e4, 0.0]]]))
    assert all(torch.isfinite(v).all() for v in (s.predictive_entropy, s.expected_entropy, s.energy))


def test_split_rows_and_scores() -> None:
    rows = torch.arange(12.0).view(6, 2)
    blocks = split_rows(rows, torch.tensor([1, 2, 3]))
    assert [tuple(b.shape) for b in blocks] == [(1, 1, 2), (2, 1, 2), (3, 1, 2)]
    s = summarize(torch.randn(4, 5, 3))
    for name in OOD_SCORES:
        assert ood_score(s, name).shape == (5,)


def test_the_one_ece_equals_torchmetrics_binning() -> None:
    """The estimator shared by the evaluation, the manifest's reference and the live gauge is torchmetrics' l1 ECE
    (15 equal-width bins), including confidences that sit exactly on bin edges."""
    from torchmetrics.functional.classification import multiclass_calibration_error

    from models.uncertainty import ECE_BINS, expected_calibration_error

    gen = torch.Generator().manual_seed(0)
    probs = torch.rand(500, 4, generator=gen).pow(3).softmax(-1)  # [N, C]
    probs[:20] = torch.tensor([0.6, 0.2, 0.1, 0.1])  # on an edge of 15 bins? 0.6 = 9/15
    labels = torch.randint(0, 4, (500,), generator=gen)
    confidence, predicted = probs.max(-1)
    expected = float(multiclass_calibration_error(probs, labels, num_classes=4, n_bins=ECE_BINS, norm="l1"))
    assert abs(expected_calibration_error(confidence, predicted == labels) - expected) < 1e-6


def test_kernel_error_and_combined_scores() -> None:
    summary = summarize(torch.tensor([[[2.0, 0.0], [0.0, 0.0]]]))  # [1, 2, 2]: one confident input, one not
    error = torch.tensor([1e-3, 1e-1])  # [2]
    torch.testing.assert_close(ood_score(summary, KERNEL_ERROR, {KERNEL_ERROR: error}), error)
    with pytest.raises(ValueError, match="scored_rows"):
        ood_score(summary, KERNEL_ERROR)
    terms = (ScoreTerm(KERNEL_ERROR, 0.5, math.log(1e-2), 2.0, log=True), ScoreTerm("max_softmax", 0.5, 0.0, 1.0))
    expected = 0.5 * (torch.log(error) - math.log(1e-2)) / 2.0 + 0.5 * (1 - summary.confidence)
    torch.testing.assert_close(ood_score(summary, COMBINED, {KERNEL_ERROR: error}, terms), expected)
    with pytest.raises(ValueError, match="needs terms"):
        ood_score(summary, COMBINED, {KERNEL_ERROR: error})
    assert needs_input_scores(KERNEL_ERROR) and needs_input_scores(COMBINED, terms)
    assert not needs_input_scores(COMBINED, terms[1:]) and not needs_input_scores("energy")


def test_a_temperature_per_input_divides_each_input_s_samples_by_its_own() -> None:
    torch.manual_seed(1)
    logits = torch.randn(4, 3, 5) * 3  # [S, B, C]
    temperatures = torch.tensor([0.5, 1.0, 2.5])  # [B]
    together = summarize(logits, temperatures)
    for i, t in enumerate(temperatures.tolist()):
        alone = summarize(logits[:, i:i + 1], t)
        for name, value in vars(together).items():
            torch.testing.assert_close(value[i:i + 1], getattr(alone, name))
    with pytest.raises(ValueError, match="one temperature per input"):
        summarize(logits, torch.ones(2))


def test_a_score_temperature_keeps_the_base_below_the_center_and_grows_above_it() -> None:
    term = ScoreTerm(KERNEL_ERROR, 1.0, math.log(1e-2), 0.5, log=True)
    temperature = ScoreTemperature(1.2, 0.4, (term,))
    errors = torch.tensor([1e-4, 1e-2, 1e-2 * math.exp(0.5), 1e-2 * math.exp(1.0)])  # z = -9.2, 0, 1, 2
    torch.testing.assert_close(temperature({KERNEL_ERROR: errors}),
                               torch.tensor([1.2, 1.2, 1.2 * math.exp(0.4), 1.2 * math.exp(0.8)]))
    with pytest.raises(ValueError, match="per-input scores only"):
        ScoreTemperature(1.0, 0.4, (ScoreTerm("max_softmax", 1.0, 0.0, 1.0),))
