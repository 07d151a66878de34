"""The multi-label maths (``models.tasks``): Bernoulli entropies, the decomposition over S samples, thresholds and
the joint energy, against direct computations."""

from __future__ import annotations

import math

import pytest
import torch

from models.tasks import (
    MULTI_LABEL,
    SINGLE_LABEL,
    MultiLabel,
    MultiLabelSummary,
    SingleLabel,
    bernoulli_entropy,
    logit_entropy,
    summarize_multi_label,
    task_for,
)
from models.uncertainty import summarize


def test_bernoulli_entropy_is_log_two_at_one_half_and_zero_at_the_ends() -> None:
    p = torch.tensor([0.0, 0.5, 1.0, 0.1])
    h = bernoulli_entropy(p)
    assert h[0] == 0 and h[2] == 0 and h[1] == pytest.approx(math.log(2))
    assert h[3] == pytest.approx(-(0.1 * math.log(0.1) + 0.9 * math.log(0.9)))


def test_entropy_from_the_logit_matches_the_probability_and_stays_finite() -> None:
    z = torch.tensor([-3.0, 0.0, 2.5, 80.0, -80.0])
    assert torch.allclose(logit_entropy(z), bernoulli_entropy(torch.sigmoid(z.double())), atol=1e-12)
    assert torch.isfinite(logit_entropy(torch.tensor([1e4, -1e4]))).all()


def test_summary_decomposes_per_label_and_sums_per_input() -> None:
    torch.manual_seed(0)
    logits = torch.randn(6, 4, 3) * 2  # [S, B, C]
    s = summarize_multi_label(logits, thresholds=torch.tensor([0.5, 0.3, 0.9]))
    assert isinstance(s, MultiLabelSummary)
    p_s = torch.sigmoid(logits.double())
    p = p_s.mean(0)
    h = -(p * p.log() + (1 - p) * (1 - p).log())
    eh = (-(p_s * p_s.log() + (1 - p_s) * (1 - p_s).log())).mean(0)
    assert torch.allclose(s.probabilities.double(), p, atol=1e-6)
    assert torch.allclose(s.label_entropy.double(), h, atol=1e-5)
    assert torch.allclose(s.label_expected_entropy.double(), eh, atol=1e-5)
    assert torch.allclose(s.label_mutual_information.double(), (h - eh).clamp_min(0), atol=1e-5)
    assert (s.label_mutual_information >= 0).all()
    assert torch.allclose(s.predictive_entropy, s.label_entropy.sum(-1)) and s.predictive_entropy.shape == (4,)
    assert torch.allclose(s.mutual_information, s.label_mutual_information.sum(-1))
    assert torch.equal(s.predicted, p >= torch.tensor([0.5, 0.3, 0.9], dtype=torch.float64))
    assert torch.equal(s.prediction, p.argmax(-1))
    assert torch.allclose(s.confidence.double(), torch.maximum(p, 1 - p).mean(-1), atol=1e-6)
    energy = -torch.nn.functional.softplus(logits.double()).sum(-1).mean(0)
    assert torch.allclose(s.energy.double(), energy, atol=1e-5)


def test_one_sample_has_no_mutual_information_and_temperatures_divide() -> None:
    logits = torch.tensor([[[2.0, -1.0]]])  # [1, 1, 2]
    s = summarize_multi_label(logits, 2.0, torch.tensor([1.0, 0.5]))
    assert s.mutual_information.item() == 0.0
    expected = torch.sigmoid(torch.tensor([1.0, -1.0]))
    assert torch.allclose(s.probabilities[0], expected)
    per_input = summarize_multi_label(logits.expand(1, 1, 2), torch.tensor([2.0]))
    assert torch.allclose(per_input.probabilities, summarize_multi_label(logits, 2.0).probabilities)


def test_the_tasks_nll_loss_and_targets() -> None:
    single, multi = task_for(SINGLE_LABEL), task_for(MULTI_LABEL, [1.0, 2.0], [0.4, 0.6])
    assert isinstance(single, SingleLabel) and isinstance(multi, MultiLabel)
    assert multi.thresholds is not None and multi.thresholds.tolist() == pytest.approx([0.4, 0.6])
    logits = torch.tensor([[1.0, -2.0], [0.5, 0.5]])
    y = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    bce = torch.nn.functional.binary_cross_entropy_with_logits(logits, y)
    assert multi.loss(logits, y).item() == pytest.approx(bce.item())
    nll = multi.per_input_nll(torch.sigmoid(logits), y)
    assert nll.sum().item() / 4 == pytest.approx(bce.item(), rel=1e-5)
    assert torch.allclose(single.summarize(logits[None]).probabilities, summarize(logits[None]).probabilities)
    assert single.per_input_nll(logits.softmax(-1), torch.tensor([0, 1])).shape == (2,)
    with pytest.raises(ValueError, match="unknown task"):
        task_for("regression")
