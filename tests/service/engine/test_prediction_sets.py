"""A request's prediction sets on Python floats and on tensors (``service.engine.prediction_sets``) are the sets
``models.conformal.ConformalTable.sets`` gives, label for label and in the same order, for every score, marginal and
per class, on probabilities with ties, zeros and thresholds equal to a label's own score."""

from __future__ import annotations

import pytest
import torch

from models.conformal import ConformalTable, ScoreRule, label_scores
from service.engine.prediction_sets import PYTHON_ELEMENTS, python_rows, row_scores, row_sets, tensor_sets

RULES = [ScoreRule("lac"), ScoreRule("aps"), ScoreRule("raps", 0.01, 1), ScoreRule("raps", 0.3, 2)]


def awkward_probabilities(n: int, classes: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Softmax rows, some with ties (equal labels, a uniform row, coarse values) and exact zeros."""
    generator = torch.Generator().manual_seed(seed)
    probs = torch.softmax(torch.randn(n, classes, generator=generator) * 3, dim=1)
    probs[0] = 1.0 / classes  # every label tied
    probs[1, :2] = 0.0  # zeros, tied at the bottom
    probs[2] = torch.softmax((torch.randn(classes, generator=generator) * 2).round(), dim=0)  # ties among the top
    return probs.to(dtype)


@pytest.mark.parametrize("classes", [2, 10, 100])
@pytest.mark.parametrize("rule", RULES, ids=lambda r: f"{r.name}-{r.penalty}")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_both_paths_give_the_sets_of_the_calibration_table(classes: int, rule: ScoreRule, dtype: torch.dtype) -> None:
    probs = awkward_probabilities(40, classes, seed=classes, dtype=dtype)
    labels = torch.randint(0, classes, (40,), generator=torch.Generator().manual_seed(1))
    # calibrated on the very inputs it is then asked about: some thresholds equal a label's own score (the <= edge)
    for table in (ConformalTable.fit(probs, labels, rule), ConformalTable.fit(probs, labels, rule, True)):
        for coverage in (0.5, 0.8, 0.9, 0.97, 0.999):  # 0.999 on 40 inputs: no finite threshold, every label
            expected = table.sets(probs, coverage)
            thresholds = table.thresholds(coverage, classes)
            assert row_sets(probs.tolist(), rule, tuple(thresholds.tolist())) == expected
            assert tensor_sets(probs, rule, thresholds) == expected


def test_python_scores_are_the_tensor_scores_bit_for_bit() -> None:
    probs = awkward_probabilities(30, 37, seed=3)
    for rule in RULES:
        assert [row_scores(row, rule) for row in probs.tolist()] == label_scores(probs, rule).tolist()


def test_small_finite_requests_are_scored_on_python_floats() -> None:
    classes = 10
    probs = awkward_probabilities(PYTHON_ELEMENTS // classes, classes, seed=4)
    rows = python_rows(probs)
    assert rows == probs.tolist()
    larger = awkward_probabilities(PYTHON_ELEMENTS // classes + 1, classes, seed=4)
    assert python_rows(larger) is None  # the tensor path
    for bad in (float("nan"), float("inf")):
        broken = probs.clone()
        broken[3, 5] = bad
        assert python_rows(broken) is None  # NaN sorts as torch sorts it only on the tensor path
