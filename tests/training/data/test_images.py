import gzip
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from training.data.images import (
    Split,
    augment,
    digits_images,
    load_dataset,
    load_fashion_mnist_split,
    photo_patch_images,
    read_idx,
    split_validation,
    uniform_noise_images,
)
from training.data.tokens import TokenSplit


def _write_idx(path: Path, array: np.ndarray) -> None:
    header = struct.pack(">HBB", 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    with gzip.open(path, "wb") as handle:
        handle.write(header + array.astype(np.uint8).tobytes())


def test_read_idx_round_trip(tmp_path: Path) -> None:
    images = np.random.default_rng(0).integers(0, 256, size=(5, 28, 28))
    _write_idx(tmp_path / "train-images-idx3-ubyte.gz", images)
    _write_idx(tmp_path / "train-labels-idx1-ubyte.gz", np.arange(5))
    np.testing.assert_array_equal(read_idx(tmp_path / "train-images-idx3-ubyte.gz"), images)
    split = load_fashion_mnist_split(tmp_path, "train")
    assert split.images.shape == (5, 1, 28, 28) and split.images.dtype == torch.float32
    assert float(split.images.max()) <= 1.0 and split.labels.tolist() == [0, 1, 2, 3, 4]


def test_missing_dataset_names_the_debian_package(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="dataset-fashion-mnist"):
        load_fashion_mnist_split(tmp_path, "train")


def test_real_fashion_mnist_and_fixed_validation_split() -> None:
    first = load_dataset("fashion_mnist", "/usr/share/datasets/fashion-mnist", 6000, 0)
    second = load_dataset("fashion_mnist", "/usr/share/datasets/fashion-mnist", 6000, 0)
    assert (len(first.train), len(first.val), len(first.test)) == (54000, 6000, 10000)
    torch.testing.assert_close(first.val.images, second.val.images)
    assert first.labels[9] == "Ankle boot"
    assert set(first.val.labels.unique().tolist()) == set(range(10))


def test_split_validation_is_disjoint() -> None:
    ids = torch.arange(100).float().view(100, 1, 1, 1)
    train, val = split_validation(Split(ids, torch.arange(100)), 20, seed=1)
    assert len(val) == 20 and len(train) == 80
    assert not set(train.labels.tolist()) & set(val.labels.tolist())


def test_augment_translates_and_flips_within_bounds() -> None:
    images = torch.rand(16, 1, 28, 28)
    out = augment(images, torch.Generator().manual_seed(0))
    assert out.shape == images.shape
    assert float(out.min()) >= 0 and float(out.max()) <= 1
    assert not torch.equal(out, images)


def test_offline_ood_sets() -> None:
    shape = (1, 28, 28)
    assert uniform_noise_images(7, shape, 0).shape == (7, *shape)
    digits = digits_images(shape)
    assert digits.shape == (1797, *shape) and float(digits.max()) <= 1
    photos = photo_patch_images(9, shape, 0)
    assert photos.shape == (9, *shape)
    torch.testing.assert_close(photos, photo_patch_images(9, shape, 0))


def test_cifar_loader_reads_the_torchvision_layout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tiny CIFAR-10 folder in torchvision's pickled layout; only the md5 check is bypassed (the real
    files are downloaded by torchvision on a machine with internet)."""
    import pickle

    import torchvision.datasets.cifar as cifar

    from training.data.images import load_cifar

    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {"data": rng.integers(0, 256, (4, 3072), dtype=np.uint8), "labels": list(range(4))}
        (folder / name).write_bytes(pickle.dumps(batch))
    (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": [f"c{i}" for i in range(10)]}))
    monkeypatch.setattr(cifar, "check_integrity", lambda *args, **kwargs: True)
    train, test, labels = load_cifar("cifar10", tmp_path)
    assert train.images.shape == (20, 3, 32, 32) and test.images.shape == (4, 3, 32, 32)
    assert float(train.images.max()) <= 1.0 and train.labels.tolist()[:4] == [0, 1, 2, 3]
    assert labels == [f"c{i}" for i in range(10)]


def test_an_image_split_maps_in_order_and_in_chunks() -> None:
    images = torch.arange(10, dtype=torch.float32).reshape(10, 1, 1, 1)  # [N, C, H, W], value = row
    split = Split(images, torch.zeros(10, dtype=torch.long))
    seen: list[int] = []

    def fn(x: torch.Tensor) -> torch.Tensor:
        seen.append(x.shape[0])
        return x.flatten(1) * 2  # [b, 1]

    out = split.map(fn, chunk=4)
    assert seen == [4, 4, 2] and torch.equal(out[:, 0], torch.arange(10, dtype=torch.float32) * 2)
    assert split.key_padding_mask is None
    (first,) = split.first_args(3)
    assert torch.equal(first, images[:3]) and split.first_args(50)[0].shape[0] == 10


def test_a_token_split_maps_short_texts_together_and_answers_in_its_own_order() -> None:
    lengths = torch.tensor([5, 1, 3, 2])
    mask = (torch.arange(5)[None, :] < lengths[:, None]).long()  # [N, L] right-padded
    ids = (torch.arange(4)[:, None] + 1) * mask  # row i holds i + 1 on its real tokens
    split = TokenSplit(ids, mask, torch.zeros(4, dtype=torch.long), ["a", "b", "c", "d"])
    widths: list[int] = []

    def fn(chunk_ids: torch.Tensor, chunk_mask: torch.Tensor) -> torch.Tensor:
        widths.append(chunk_ids.shape[1])
        return chunk_ids.sum(dim=1) / chunk_mask.sum(dim=1)  # [b]: the row's own id

    out = split.map(fn, chunk=2)
    assert widths == [2, 5]  # lengths 1 and 2 together, trimmed to 2; then 3 and 5
    assert torch.equal(out, torch.tensor([1.0, 2.0, 3.0, 4.0]))  # back in the split's order
    assert torch.equal(split.key_padding_mask, mask.bool())
    first_ids, first_mask = split.first_args(2)
    assert first_ids.shape == (2, 5) and torch.equal(first_mask, mask[:2])
