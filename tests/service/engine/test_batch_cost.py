"""What a batch costs against its budget (``service.engine.batch_cost.BatchCost``): rows times the widest input's
width, and the largest forward the budget allows (the biggest shape bucket)."""

from __future__ import annotations

import dataclasses
import functools

import pytest

from service.engine.batch_cost import BatchCost, unit_width
from service.engine.texts import padded_length


def test_image_rows_cost_one_each() -> None:
    cost = BatchCost(8, "max_batch_samples", "sampled rows")
    assert cost.width is unit_width and cost.max_rows == 8
    assert cost.cost(rows=5, longest=0) == cost.cost(rows=5, longest=1000) == 5  # images have no width
    assert cost.fits(8, 0) and not cost.fits(9, 0)
    assert cost.full(8, 0) and not cost.full(7, 0)


def test_text_rows_cost_their_padded_width() -> None:
    width = functools.partial(padded_length, max_length=32)
    cost = BatchCost(256, "max_batch_tokens", "padded tokens x samples", width)
    assert cost.max_rows == 32  # each row at least one padded width of 8 tokens
    assert cost.cost(rows=4, longest=9) == 4 * 16  # 9 tokens pad to 16
    assert cost.cost(rows=4, longest=100) == 4 * 32  # never wider than max_length
    assert cost.fits(8, 32) and not cost.fits(9, 32)
    assert cost.full(16, 16) and not cost.full(15, 16)


def test_a_budget_below_one_row_still_allows_one_row_per_forward() -> None:
    cost = BatchCost(4, "max_batch_tokens", "padded tokens x samples", functools.partial(padded_length, max_length=64))
    assert cost.max_rows == 1
    assert not cost.fits(1, 1) and cost.full(1, 1)  # the batching runs such an input alone


def test_max_rows_is_derived_not_set() -> None:
    cost = BatchCost(8, "max_batch_samples", "sampled rows")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cost.max_rows = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        BatchCost(8, "max_batch_samples", "sampled rows", unit_width, 3)  # type: ignore[call-arg]
