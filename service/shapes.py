"""Shape buckets: the row and input counts of a forward padded up to a few fixed sizes, so a compiled device sees
the same shapes again and again instead of a new one per batch (each new shape costs the TorchScript executor
profiling runs and a fusion, which would otherwise land on live requests).

The sizes are the powers of two up to the batch budget, and the budget itself. A forward of ``b`` inputs and ``R``
sampled rows runs as ``bucket(b)`` inputs and ``bucket(R)`` rows: the padding inputs are zeros (texts: one pad token)
with no sample rows, and the padding rows are extra samples of the last real input, so the real rows are exactly the
first ``R`` rows of the output (rows are grouped by input in order) and the rest is dropped before anything is
split back. A count above the largest bucket (one input with more samples than the budget) runs unpadded.

Padding costs compute, so it pays only where a forward's time hardly grows with its rows (a GPU); on a CPU it is off
(``service.device.DEVICE_DEFAULTS``)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

# forwards per warmed shape: the profiling executor records a shape's first runs before it optimises for it
WARM_CALLS = 3
MIN_TEXT_WIDTH = 8  # service.texts pads token widths to multiples of 8


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
    """The shapes forwards run at on this device: the row budget (images), the token budget (texts) and whether
    counts are padded to buckets."""

    max_batch_samples: int
    max_batch_tokens: int
    buckets: bool

    def row_sizes(self, text: bool) -> tuple[int, ...]:
        """Bucket sizes of rows (and of inputs): a text forward has at most ``max_batch_tokens / 8`` rows."""
        return bucket_sizes(max(1, self.max_batch_tokens // MIN_TEXT_WIDTH) if text else self.max_batch_samples)

    def padding(self, repeats: list[int], text: bool = False) -> Padding:
        rows = sum(repeats)
        if not self.buckets:
            return Padding(len(repeats), rows, len(repeats), rows)
        sizes = self.row_sizes(text)
        return Padding(bucket(len(repeats), sizes), bucket(rows, sizes), len(repeats), rows)


def pad_pixels(pixels: torch.Tensor, padding: Padding) -> torch.Tensor:
    """``[b, C, H, W]`` -> ``[padding.inputs, C, H, W]`` with zero images after the real ones."""
    extra = padding.inputs - padding.real_inputs
    if extra == 0:
        return pixels
    return torch.cat([pixels, pixels.new_zeros((extra, *pixels.shape[1:]))])  # [inputs, C, H, W]


def pad_tokens(input_ids: torch.Tensor, mask: torch.Tensor, padding: Padding, pad_id: int
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """``[b, L]`` ids and mask -> ``[padding.inputs, L]``: each padding input is one visible pad token (a fully
    masked row would make its attention softmax NaN)."""
    extra = padding.inputs - padding.real_inputs
    if extra == 0:
        return input_ids, mask
    ids = input_ids.new_full((extra, input_ids.shape[1]), pad_id)  # [extra, L]
    visible = mask.new_zeros((extra, mask.shape[1]))  # [extra, L]
    visible[:, 0] = 1
    return torch.cat([input_ids, ids]), torch.cat([mask, visible])  # [inputs, L] each


def warm_counts(shapes: BatchShapes, text: bool) -> Iterator[tuple[int, int]]:
    """(inputs, rows) of every forward warm-up runs: each row bucket with one input (all rows its samples) and with
    as many inputs as rows (one sample each), the two ends of what a batch can be."""
    for rows in shapes.row_sizes(text):
        yield 1, rows
        if rows > 1:
            yield rows, rows


def warm_text_width(shapes: BatchShapes, rows: int, max_length: int) -> int:
    """The widest padded text width (a multiple of 8, at most ``max_length``) a forward of ``rows`` rows can have
    within the token budget."""
    width = max(MIN_TEXT_WIDTH, shapes.max_batch_tokens // rows // MIN_TEXT_WIDTH * MIN_TEXT_WIDTH)
    return min(width, max_length)
