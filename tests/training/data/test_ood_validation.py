"""A user's OOD-validation set (``export.ood_validation_data``): a folder of images read at the model's input shape
whatever their size and mode, or a text file read one input per line, at most ``limit`` of either, and a clear error
for what cannot be one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from training.data.ood_validation import describe, user_ood_images, user_ood_texts
from training.data.sources.errors import DataError
from training.data.tokens import train_wordpiece


def test_images_in_every_subfolder_are_read_at_the_model_s_shape(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    (tmp_path / "a" / "b").mkdir(parents=True)
    Image.fromarray(rng.integers(0, 256, (20, 30, 3), dtype=np.uint8)).save(tmp_path / "a" / "one.png")
    Image.fromarray(rng.integers(0, 256, (9, 7), dtype=np.uint8)).save(tmp_path / "a" / "b" / "two.jpg")
    Image.fromarray(rng.integers(0, 256, (5, 5), dtype=np.uint8)).save(tmp_path / ".hidden.png")
    (tmp_path / "notes.txt").write_text("not an image")
    split = user_ood_images(tmp_path, limit=10, shape=(1, 16, 16), seed=0)
    assert tuple(split.images.shape) == (2, 1, 16, 16) and float(split.images.max()) <= 1.0
    assert len(user_ood_images(tmp_path, limit=1, shape=(3, 8, 8), seed=0)) == 1
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="no PNG or JPEG"):
        user_ood_images(tmp_path / "empty", limit=10, shape=(1, 8, 8), seed=0)
    with pytest.raises(DataError, match="not a folder"):
        user_ood_images(tmp_path / "notes.txt", limit=10, shape=(1, 8, 8), seed=0)


def test_texts_are_the_file_s_non_empty_lines_at_most_limit(tmp_path: Path) -> None:
    lines = [f"an editorial sentence number {i} about the city budget" for i in range(30)]
    tokenizer = train_wordpiece(lines, vocab_size=120)
    path = tmp_path / "near.txt"
    path.write_text("\n".join(lines[:10]) + "\n\n   \n" + "\n".join(lines[10:]) + "\n")
    split = user_ood_texts(path, limit=50, tokenizer=tokenizer, max_characters=200, seed=0)
    assert len(split) == 30
    assert len(user_ood_texts(path, limit=7, tokenizer=tokenizer, max_characters=200, seed=0)) == 7
    assert describe(path).startswith("near.txt (the user's OOD validation set")
    (tmp_path / "blank.txt").write_text("\n \n")
    with pytest.raises(DataError, match="no line"):
        user_ood_texts(tmp_path / "blank.txt", limit=5, tokenizer=tokenizer, max_characters=200, seed=0)
    (tmp_path / "binary.txt").write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(DataError, match="UTF-8"):
        user_ood_texts(tmp_path / "binary.txt", limit=5, tokenizer=tokenizer, max_characters=200, seed=0)
