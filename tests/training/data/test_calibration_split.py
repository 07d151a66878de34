"""The calibration split: a seeded random share of validation, disjoint from what stays, in order, lazy on disk."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from training.data.calibration_split import calibration_line, carve_calibration, coverage_spread
from training.data.image_file import ImageFile
from training.data.images import Dataset, Split


def dataset(n_val: int, images: torch.Tensor | ImageFile | None = None) -> Dataset:
    val = Split(torch.arange(n_val, dtype=torch.float32).view(n_val, 1, 1, 1) if images is None else images,
                torch.arange(n_val) % 3)
    empty = Split(torch.zeros(0, 1, 1, 1), torch.zeros(0, dtype=torch.long))
    return Dataset(empty, val, empty, ["a", "b", "c"])


def test_a_seeded_share_moves_out_and_the_rest_keeps_its_order() -> None:
    carved, calibration = carve_calibration(dataset(100), 0.25, seed=0)
    assert calibration is not None and len(calibration) == 25 and len(carved.val) == 75
    kept = carved.val.images.flatten().tolist()
    moved = calibration.images.flatten().tolist()
    assert kept == sorted(kept) and moved == sorted(moved) and not set(kept) & set(moved)
    assert set(kept) | set(moved) == set(range(100))
    assert moved != list(range(75, 100))  # a random share, not the last rows (a file may be sorted by label)
    again, same = carve_calibration(dataset(100), 0.25, seed=0)
    assert same is not None and torch.equal(same.images, calibration.images)  # the run's seed decides it
    whole = dataset(100)
    assert carve_calibration(whole, 0.0, seed=0) == (whole, None)  # no share: the data as it was


def test_too_large_a_share_is_refused_and_the_plan_says_how_many() -> None:
    with pytest.raises(ValueError, match="calibration_share"):
        carve_calibration(dataset(3), 0.9, seed=0)
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        carve_calibration(dataset(10), 1.0, seed=0)
    assert "1,500 of the 6,000 validation inputs" in calibration_line(6000, 0.25)
    assert "none" in calibration_line(6000, 0.0)
    multi_label = calibration_line(6000, 0.25, multi_label=True)
    assert "1,500 of the 6,000" in multi_label and "label sets with a recall guarantee" in multi_label


def test_the_plan_says_how_far_one_draw_moves_the_coverage() -> None:
    """Split conformal's coverage given its draw is Beta(k, n + 1 - k), k = ceil(0.9 (n + 1)): checked against that
    Beta's spread by simulation, and the plan warns below 900 inputs, where it passes a point."""
    count = 250
    k = 226  # ceil(0.9 * 251)
    draws = torch.distributions.Beta(float(k), float(count + 1 - k)).sample((20000,))  # [20000]
    assert abs(coverage_spread(count) - draws.std().item()) < 0.001
    assert coverage_spread(250) > 0.018 > coverage_spread(500) > 0.01 > coverage_spread(1000)
    assert "+-1.9 points" in calibration_line(1000, 0.25) and "raise export.calibration_share" in calibration_line(
        1000, 0.25)
    assert "raise export.calibration_share" not in calibration_line(6000, 0.25)  # 1,500: +-0.8 points


def test_images_on_disk_stay_on_disk(tmp_path: Path) -> None:
    stored = ImageFile.create(tmp_path / "val.u8", 40, (1, 2, 2))
    for row in range(40):
        stored.write(row, torch.full((1, 2, 2), row / 255))
    carved, calibration = carve_calibration(dataset(40, stored), 0.5, seed=1)
    assert isinstance(calibration.images, ImageFile) and isinstance(carved.val.images, ImageFile)
    rows = calibration.images[torch.arange(len(calibration))].mul(255).round()[:, 0, 0, 0].long()  # read back
    assert rows.tolist() == calibration.images.rows.tolist()
