"""Shape buckets: the row and input counts of a forward padded up to a few fixed sizes, so a compiled device sees
the same shapes again and again instead of a new one per batch (each new shape costs the TorchScript executor
profiling runs and a fusion, which would otherwise land on live requests).

The sizes are the powers of two up to the batch budget, and the budget itself. A forward of ``b`` inputs and ``R``
sampled rows runs as ``bucket(b)`` inputs and ``bucket(R)`` rows: the padding inputs are zeros (texts: one pad token)
with no sample rows, and the padding rows are extra samples of the last real input, so the real rows are exactly the
first ``R`` rows of the output (rows are grouped by input in order) and the rest is dropped before anything is
split back. A count above the largest bucket (one input with more samples than the budget) runs unpadded.

Padding costs compute, so it pays only where a forward's time hardly grows with its rows (a GPU); on a CPU it is off
(``service.engine.device.DEVICE_DEFAULTS``)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

# forwards per warmed shape: the profiling executor records a shape's first runs before it optimises for it
WARM_CALLS = 3


def bucket_sizes(limit: int) -> tuple[int, ...]:
    """Powers of two below ``limit``, then ``limit``: 128 -> (1, 2, 4, ..., 128); 100 -> (1, ..., 64, 100)."""
    sizes, size = [], 1
    while size < limit:
        sizes.append(size)
        size *= 2
    return (*sizes, limit)


def bucket(count: int, sizes: tuple[int, ...]) -> int:
    """The smallest size >= ``count``, or ``count`` itself above the largest."""
    return next((size for size in sizes if size >= count), count)


@dataclass(frozen=True)
class Padding:
    """How one forward is padded: ``inputs`` and ``rows`` it runs as, of which the first ``real_rows`` are kept."""

    inputs: int
    rows: int
    real_inputs: int
    real_rows: int

    def repeats(self, repeats: list[int]) -> torch.Tensor:
        """Per-input sample counts of the padded forward ``[inputs]`` (int64, host): the padding rows go to the last
        real input, the padding inputs get none."""
        padded = [*repeats, *([0] * (self.inputs - self.real_inputs))]
        padded[self.real_inputs - 1] += self.rows - self.real_rows
        return torch.tensor(padded, dtype=torch.long)  # [inputs]


@dataclass(frozen=True)
class BatchShapes:
    """The budgets of this device's batches (sampled rows, and padded tokens x samples: the batch runner uses the one
    its inputs are measured in) and whether forwards are padded to buckets."""

    max_batch_samples: int
    max_batch_tokens: int
    buckets: bool

    def padding(self, repeats: list[int], max_rows: int) -> Padding:
        """How a forward of ``repeats`` is padded; ``max_rows`` (the batch cost's ``max_rows``) is the largest
        bucket."""
        rows = sum(repeats)
        if not self.buckets:
            return Padding(len(repeats), rows, len(repeats), rows)
        sizes = bucket_sizes(max_rows)
        return Padding(bucket(len(repeats), sizes), bucket(rows, sizes), len(repeats), rows)


def warm_counts(max_rows: int) -> Iterator[tuple[int, int]]:
    """(inputs, rows) of every forward warm-up runs: each row bucket up to ``max_rows`` with one input (all rows its
    samples) and with as many inputs as rows (one sample each), the two ends of what a batch can be."""
    for rows in bucket_sizes(max_rows):
        yield 1, rows
        if rows > 1:
            yield rows, rows
