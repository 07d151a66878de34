"""``DataSummary``, what was read, for a user to check before any training starts: classes and counts per split,
where each split came from, and the inputs' sizes (``ImageStats``, ``TextStats``)."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from models.image_input import IMAGE_CONVERSION
from training.data.sources.splits import SPLITS


@dataclass
class Lengths:
    """The distribution of per-input lengths (characters or tokens)."""

    min: int
    median: float
    p95: float
    max: int

    @classmethod
    def of(cls, values: Sequence[int]) -> Lengths:
        array = np.asarray(values, dtype=np.int64)
        return cls(int(array.min()), float(np.median(array)), float(np.percentile(array, 95)), int(array.max()))

    def render(self) -> str:
        return f"min {self.min}, median {self.median:g}, p95 {self.p95:g}, max {self.max}"


@dataclass
class ImageStats:
    """What the image files were before conversion: a model trained on 28x28 grey sees little of a 4000x3000 photo."""

    files: int
    formats: dict[str, int]  # PNG / JPEG -> files
    modes: dict[str, int]  # PIL colour mode as stored (L, RGB, RGBA, P, I;16, ...) -> files
    widths: tuple[int, int]  # min, max
    heights: tuple[int, int]
    most_common_size: tuple[int, int]  # (w, h)
    most_common_count: int
    resized: int  # files whose size is not the model's
    target: tuple[int, int, int]  # C, H, W
    conversion: str = IMAGE_CONVERSION


@dataclass
class TextStats:
    """Text lengths, and how many texts the pipeline will cut (characters) and truncate (tokens) per split."""

    characters: Lengths
    max_characters: int | None
    cut: dict[str, int] | None  # split -> texts longer than max_characters
    tokens: Lengths | None  # after the cut, as count_tokens counts them
    max_length: int | None
    truncated: dict[str, int] | None  # split -> texts of more than max_length tokens


@dataclass
class DataSummary:
    """What was read, for a user to check before training: classes and counts per split, where each split came from,
    and the inputs' sizes."""

    source: str
    labels: list[str]
    label_kind: str  # how the labels were read: class names or integer indices, given or from the data
    counts: dict[str, list[int]]  # split -> examples per class, in label index order
    origins: dict[str, str]  # split -> given (where) or carved (seed, fraction)
    images: ImageStats | None = None
    texts: TextStats | None = None
    warnings: list[str] = field(default_factory=list)

    def render(self) -> str:
        lines = [f"Data: {self.source}", f"Classes: {len(self.labels)} ({self.label_kind})"]
        lines += _count_table(self.labels, self.counts)
        lines.append("Splits:")
        lines += [f"  {name:<5}  {self.origins[name]}" for name in SPLITS]
        if self.images is not None:
            lines += _render_images(self.images)
        if self.texts is not None:
            lines += _render_texts(self.texts)
        if self.warnings:
            lines.append("Warnings:")
            lines += [f"  - {warning}" for warning in self.warnings]
        return "\n".join(lines)


def label_kind(kind: str, what: str) -> str:
    """How the labels were read, for ``DataSummary.label_kind``: ``what`` (a column, folder names) read as ``kind``."""
    return f"{what} read as {kind}"


def class_counts(labels: torch.Tensor, num_classes: int) -> list[int]:
    """Examples per class of ``labels`` [N], every class counted (0 too), for ``DataSummary.counts``."""
    return torch.bincount(labels, minlength=num_classes).tolist()


def _count_table(labels: list[str], counts: dict[str, list[int]]) -> list[str]:
    names = [_short(name) for name in labels]
    totals = {split: sum(counts[split]) for split in SPLITS}
    index_width = len(str(max(len(labels) - 1, 0)))
    name_width = max([len("label"), *(len(n) for n in names)])
    widths = {split: max(len(split), len(str(totals[split]))) for split in SPLITS}

    def row(index: str, name: str, cells: dict[str, Any]) -> str:
        cells_text = "".join(f"  {cells[s]!s:>{widths[s]}}" for s in SPLITS)
        return f"  {index:>{index_width}}  {name:<{name_width}}{cells_text}"

    return [row("#", "label", {s: s for s in SPLITS}),
            *(row(str(i), name, {s: counts[s][i] for s in SPLITS}) for i, name in enumerate(names)),
            row("", "total", totals)]


def _render_images(stats: ImageStats) -> list[str]:
    channels, height, width = stats.target
    (w, h), count = stats.most_common_size, stats.most_common_count
    return [f"Images: {stats.files} files ({_counts(stats.formats)}); colour modes: {_counts(stats.modes)}",
            f"  original sizes: width {stats.widths[0]}..{stats.widths[1]}, height "
            f"{stats.heights[0]}..{stats.heights[1]}, most common {w}x{h} ({count} files)",
            f"  converted to {'L' if channels == 1 else 'RGB'} {channels}x{height}x{width} as the server converts "
            f"requests; {stats.resized} of {stats.files} resized",
            textwrap.fill(f"conversion: {stats.conversion}", 118, initial_indent="  ", subsequent_indent="    ")]


def _render_texts(stats: TextStats) -> list[str]:
    lines = [f"Characters per text: {stats.characters.render()}"]
    if stats.max_characters is not None and stats.cut is not None:
        lines.append(f"  cut at {stats.max_characters} characters: {_per_split(stats.cut)}")
    if stats.tokens is not None:
        lines.append(f"Tokens per text (after the cut): {stats.tokens.render()}")
    if stats.max_length is not None and stats.truncated is not None:
        lines.append(f"  truncated at {stats.max_length} tokens: {_per_split(stats.truncated)}")
    return lines


def _counts(counter: dict[str, int]) -> str:
    return ", ".join(f"{key} {value}" for key, value in sorted(counter.items()))


def _per_split(values: dict[str, int]) -> str:
    return ", ".join(f"{split} {values[split]}" for split in SPLITS)


def _short(name: str, limit: int = 40) -> str:
    return name if len(name) <= limit else name[: limit - 3] + "..."
