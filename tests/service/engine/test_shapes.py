"""Shape buckets (``service.engine.shapes``): the sizes a forward is padded to, where the padding rows and inputs go,
and the (inputs, rows) the warm-up runs."""

from __future__ import annotations

from service.engine.shapes import BatchShapes, Padding, bucket, bucket_sizes, warm_counts


def test_sizes_are_the_powers_of_two_below_the_budget_then_the_budget() -> None:
    assert bucket_sizes(128) == (1, 2, 4, 8, 16, 32, 64, 128)
    assert bucket_sizes(100) == (1, 2, 4, 8, 16, 32, 64, 100)
    assert bucket_sizes(1) == (1,)


def test_a_count_goes_up_to_the_next_size_and_runs_unpadded_above_the_largest() -> None:
    sizes = bucket_sizes(100)
    assert [bucket(n, sizes) for n in (1, 3, 4, 5, 65, 100, 101, 500)] == [1, 4, 4, 8, 100, 100, 101, 500]


def test_padding_rows_go_to_the_last_real_input_and_padding_inputs_get_none() -> None:
    shapes = BatchShapes(max_batch_samples=16, max_batch_tokens=2048, buckets=True)
    padding = shapes.padding([2, 3, 1], max_rows=16)  # 3 inputs -> 4; 6 rows -> 8
    assert padding == Padding(inputs=4, rows=8, real_inputs=3, real_rows=6)
    counts = padding.repeats([2, 3, 1])
    assert counts.tolist() == [2, 3, 3, 0] and counts.dtype.is_floating_point is False
    assert int(counts.sum()) == padding.rows  # the real rows stay the first 6, in input order


def test_without_buckets_a_forward_runs_as_it_is() -> None:
    shapes = BatchShapes(max_batch_samples=16, max_batch_tokens=2048, buckets=False)
    padding = shapes.padding([2, 3, 1], max_rows=16)
    assert padding == Padding(3, 6, 3, 6) and padding.repeats([2, 3, 1]).tolist() == [2, 3, 1]


def test_one_input_over_the_largest_bucket_is_not_padded() -> None:
    shapes = BatchShapes(max_batch_samples=16, max_batch_tokens=2048, buckets=True)
    assert shapes.padding([40], max_rows=16) == Padding(1, 40, 1, 40)


def test_the_warm_up_runs_both_ends_of_every_row_bucket() -> None:
    assert list(warm_counts(6)) == [(1, 1), (1, 2), (2, 2), (1, 4), (4, 4), (1, 6), (6, 6)]
    assert list(warm_counts(1)) == [(1, 1)]
