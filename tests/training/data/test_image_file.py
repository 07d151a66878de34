"""Decoded images on disk (``ImageFile``): what is read back is exactly what was decoded, slices are views, and a
run's store lets a later stage read the decoded file instead of decoding the folder again."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import training.data.sources.images as image_sources
from training.data.image_file import ImageFile
from training.data.sources import load_image_folder, read_image


def write_folder(root: Path, per_class: int = 6) -> Path:
    rng = np.random.default_rng(0)
    for label, name in enumerate(["ant", "bee"]):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            pixels = rng.integers(0, 256, (int(rng.integers(10, 30)), int(rng.integers(10, 30)), 3), dtype=np.uint8)
            pixels[..., label] = 255
            Image.fromarray(pixels, "RGB").save(root / name / f"{i}.png")
    return root


def test_rows_read_back_exactly_as_decoded(tmp_path: Path) -> None:
    paths = sorted(write_folder(tmp_path / "images").rglob("*.png"))
    decoded = torch.stack([read_image(p, 3, 16, 12)[0] for p in paths])  # [N, 3, 16, 12]
    stored = ImageFile.create(tmp_path / "store" / "images.u8", len(paths), (3, 16, 12))
    for i, image in enumerate(decoded):
        stored.write(i, image)
    assert stored.shape == (len(paths), 3, 16, 12) and (tmp_path / "store" / "images.u8").stat().st_size == \
        len(paths) * 3 * 16 * 12
    assert torch.equal(stored[torch.arange(len(paths))], decoded)
    scattered = torch.tensor([7, 2, 3, 4, 0, 11])  # a run of consecutive rows and single rows, out of order
    assert torch.equal(stored[scattered], decoded[scattered])
    assert torch.equal(stored[5], decoded[5]) and torch.equal(stored[-1], decoded[-1])
    view = stored[2:6]
    assert isinstance(view, ImageFile) and len(view) == 4
    assert torch.equal(view[torch.tensor([0, 3])], decoded[torch.tensor([2, 5])])


def test_a_temporary_file_lives_as_long_as_its_views(tmp_path: Path) -> None:
    stored = ImageFile.create(None, 3, (1, 2, 2))
    path = stored.path
    view = stored[1:]
    del stored
    assert path.is_file() and view[torch.tensor([0])].shape == (1, 1, 2, 2)
    del view
    assert not path.exists()


def test_a_runs_store_is_decoded_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = write_folder(tmp_path / "images")
    first, _ = load_image_folder(root, 3, 16, 16, labels=None, seed=0, store=tmp_path / "store")
    files = sorted((tmp_path / "store").glob("*.u8"))
    assert len(files) == 3  # train, val, test

    def no_decoding(*args: object) -> None:
        raise AssertionError("decoded again")

    monkeypatch.setattr(image_sources, "read_image", no_decoding)
    again, summary = load_image_folder(root, 3, 16, 16, labels=None, seed=0, store=tmp_path / "store")
    for a, b in ((first.train, again.train), (first.val, again.val), (first.test, again.test)):
        assert torch.equal(a.images[torch.arange(len(a))], b.images[torch.arange(len(b))])
        assert torch.equal(a.labels, b.labels)
    assert summary.images is not None and summary.images.files == 12  # the summary read from the store's index
    monkeypatch.undo()
    (root / "ant" / "0.png").unlink()  # other files: another key, decoded afresh
    load_image_folder(root, 3, 16, 16, labels=None, seed=0, store=tmp_path / "store")
    assert len(list((tmp_path / "store").glob("*.u8"))) > 3
