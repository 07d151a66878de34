"""Image datasets: Fashion-MNIST from the Debian package's idx files and CIFAR through torchvision for users with
internet (in-memory tensors), a user's image folder (on disk, ``training.data.sources``), and the offline OOD sets."""

from __future__ import annotations

import gzip
import struct
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch

from training.data.image_file import ImageFile

FASHION_MNIST_LABELS = [
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
]
FASHION_MNIST_FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}


ForwardArgs = tuple[torch.Tensor, ...]  # what a model takes besides n_samples: (pixels,) or (input_ids, attention_mask)


class Inputs(ABC):
    """A split of either modality as the pipeline reads it: the inputs of rows ``index`` as a model's positional
    arguments, and any per-input function mapped over the split in chunks. Images and texts differ only in how
    they are cut into chunks (texts by length, so little padding) and what a row's arguments are."""

    labels: torch.Tensor  # [N] int64
    teacher_chunk: ClassVar[int]  # inputs per teacher forward (embedding, prefix, rollout)

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    @abstractmethod
    def forward_args(self, index: torch.Tensor) -> ForwardArgs:
        """The model arguments of rows ``index``: (pixels [b, C, H, W],) or (ids, mask) [b, l] each."""

    @property
    @abstractmethod
    def key_padding_mask(self) -> torch.Tensor | None:
        """[N, L] bool, True on real tokens; None for images (every patch is real)."""

    def first_args(self, n: int) -> ForwardArgs:
        """The model arguments of the first ``n`` rows (all of them when fewer) as one batch."""
        return self.forward_args(torch.arange(min(n, len(self))))

    def order(self) -> torch.Tensor:
        """The order in which rows are cut into chunks [N]."""
        return torch.arange(len(self))

    def chunk_indices(self, chunk: int) -> Iterator[torch.Tensor]:
        order = self.order()
        for start in range(0, len(order), chunk):
            yield order[start : start + chunk]

    @torch.no_grad()
    def map(self, fn: Callable[..., torch.Tensor], chunk: int, device: torch.device | str = "cpu", dim: int = 0
            ) -> torch.Tensor:
        """``fn(*forward_args)`` (on ``device``, without autograd) over the split in chunks of ``chunk`` rows (bounded
        forwards are fastest on CPU), concatenated along ``dim`` back in the split's order. ``fn`` returns [.., b, ..]
        on the CPU."""
        order = self.order()
        parts = [fn(*(a.to(device) for a in self.forward_args(index))) for index in self.chunk_indices(chunk)]
        return torch.cat(parts, dim=dim).index_select(dim, torch.argsort(order))


def key_padding(args: ForwardArgs) -> torch.Tensor | None:
    """The key padding mask [b, l] bool of one chunk's model arguments: a text's attention mask, none for images."""
    return args[1].bool() if len(args) > 1 else None


@dataclass
class Split(Inputs):
    """Images float32 in [0, 1] [N, C, H, W] (in memory, or on disk and read per batch: ``ImageFile``) and labels
    int64 [N]."""

    images: torch.Tensor | ImageFile
    labels: torch.Tensor
    teacher_chunk: ClassVar[int] = 256

    def head(self, n: int | None) -> Split:
        return self if n is None else Split(self.images[:n], self.labels[:n])

    def subset(self, index: torch.Tensor) -> Split:
        """Rows ``index`` (images on disk stay there)."""
        images = self.images.view(index) if isinstance(self.images, ImageFile) else self.images[index]
        return Split(images, self.labels[index])

    def forward_args(self, index: torch.Tensor) -> ForwardArgs:
        return (self.images[index],)  # ([b, C, H, W],)

    @property
    def key_padding_mask(self) -> None:
        return None


@dataclass
class Dataset:
    train: Split
    val: Split
    test: Split
    labels: list[str]


def read_idx(path: Path) -> np.ndarray:
    """Read an (optionally gzipped) idx file: magic (dtype code, ndim), big-endian dims, payload."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as handle:
        data = handle.read()
    zero, dtype_code, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype_code != 0x08:
        raise ValueError(f"{path} is not an unsigned-byte idx file")
    dims = struct.unpack(f">{ndim}I", data[4 : 4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load_fashion_mnist_split(root: str | Path, split: str) -> Split:
    root = Path(root)
    images_file, labels_file = FASHION_MNIST_FILES[split]
    if not (root / images_file).exists():
        raise FileNotFoundError(
            f"Fashion-MNIST not found in {root}: install the Debian package 'dataset-fashion-mnist' "
            "(apt-get install dataset-fashion-mnist) or set data.root"
        )
    images = torch.from_numpy(read_idx(root / images_file).copy()).float().div_(255.0).unsqueeze(1)
    labels = torch.from_numpy(read_idx(root / labels_file).astype(np.int64))
    return Split(images, labels)


def split_validation(train: Split, val_size: int, seed: int) -> tuple[Split, Split]:
    """A fixed, seeded validation split carved out of the training set."""
    order = torch.randperm(len(train), generator=torch.Generator().manual_seed(seed))
    val_idx, train_idx = order[:val_size], order[val_size:]
    return Split(train.images[train_idx], train.labels[train_idx]), Split(train.images[val_idx], train.labels[val_idx])


def load_cifar(name: str, root: str | Path) -> tuple[Split, Split, list[str]]:
    """CIFAR-10/100 through torchvision (downloads; for users with internet)."""
    from torchvision import datasets

    cls = {"cifar10": datasets.CIFAR10, "cifar100": datasets.CIFAR100}[name]
    splits = []
    labels: list[str] = []
    for train in (True, False):
        ds = cls(root=str(root), train=train, download=True)
        images = torch.from_numpy(np.asarray(ds.data)).permute(0, 3, 1, 2).float().div_(255.0)
        splits.append(Split(images, torch.tensor(ds.targets, dtype=torch.long)))
        labels = list(ds.classes)
    return splits[0], splits[1], labels


def resized(images: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Images [N, C, h, w] in [0, 1] at ``size`` (H, W), as the server converts an upload of the same images: bilinear
    with half-pixel centres, then rounded to 8 bits (the server resizes the decoded 8-bit image)."""
    if tuple(images.shape[-2:]) == size:
        return images
    out = torch.nn.functional.interpolate(images, size=size, mode="bilinear", align_corners=False)  # [N, C, H, W]
    return out.mul_(255.0).round_().clamp_(0.0, 255.0).div_(255.0)


def load_dataset(dataset: str, root: str, val_size: int, split_seed: int,
                 train_limit: int | None = None, test_limit: int | None = None) -> Dataset:
    if dataset == "fashion_mnist":
        full_train = load_fashion_mnist_split(root, "train")
        test = load_fashion_mnist_split(root, "test")
        labels = FASHION_MNIST_LABELS
    elif dataset in ("cifar10", "cifar100"):
        full_train, test, labels = load_cifar(dataset, root)
    else:
        raise ValueError(f"unknown dataset {dataset!r}")
    train, val = split_validation(full_train, val_size, split_seed)
    return Dataset(train.head(train_limit), val, test.head(test_limit), labels)


def batches(split: Split, batch_size: int, shuffle: bool, generator: torch.Generator | None = None,
            rank: int = 0, world_size: int = 1):
    """Yield (images, labels) mini-batches; with ``world_size`` > 1 each rank gets a disjoint shard."""
    n = len(split)
    order = torch.randperm(n, generator=generator) if shuffle else torch.arange(n)
    order = order[rank::world_size]
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        yield split.images[idx], split.labels[idx]


def augment(images: torch.Tensor, generator: torch.Generator, pad: int = 2, flip: bool = True) -> torch.Tensor:
    """Random translation by up to ``pad`` pixels (zero padding) and random horizontal flips, per image."""
    n, _, h, w = images.shape
    padded = torch.nn.functional.pad(images, (pad, pad, pad, pad))  # [N, C, H+2p, W+2p]
    dy = torch.randint(0, 2 * pad + 1, (n,), generator=generator)
    dx = torch.randint(0, 2 * pad + 1, (n,), generator=generator)
    rows = (dy[:, None] + torch.arange(h)[None]).view(n, 1, h, 1)  # [N, 1, H, 1]
    cols = (dx[:, None] + torch.arange(w)[None]).view(n, 1, 1, w)  # [N, 1, 1, W]
    batch_idx = torch.arange(n).view(n, 1, 1, 1)
    out = padded[batch_idx, torch.arange(images.shape[1]).view(1, -1, 1, 1), rows, cols]  # [N, C, H, W]
    if flip:
        flips = torch.rand(n, generator=generator) < 0.5
        out[flips] = out[flips].flip(-1)
    return out


# --- offline OOD sets -------------------------------------------------------------------------------

def uniform_noise_images(n: int, shape: tuple[int, int, int], seed: int) -> torch.Tensor:
    return torch.rand((n, *shape), generator=torch.Generator().manual_seed(seed))


def digits_images(shape: tuple[int, int, int]) -> torch.Tensor:
    """scikit-learn's 1,797 8x8 digits, upsampled (bilinear) to the model's size, in [0, 1]."""
    from sklearn.datasets import load_digits

    digits = torch.from_numpy(load_digits().images).float().div_(16.0).unsqueeze(1)  # [N, 1, 8, 8]
    up = torch.nn.functional.interpolate(digits, size=shape[1:], mode="bilinear", align_corners=False)
    return up.clamp(0, 1).expand(-1, shape[0], -1, -1).contiguous()


def photo_patch_images(n: int, shape: tuple[int, int, int], seed: int) -> torch.Tensor:
    """Random crops of scikit-learn's two sample photos, downscaled: the OOD *validation* set."""
    from sklearn.datasets import load_sample_images

    gen = torch.Generator().manual_seed(seed)
    photos = [torch.from_numpy(np.array(img)).permute(2, 0, 1).float().div(255.0)
              for img in load_sample_images().images]  # [3, H, W] each
    out = []
    for i in range(n):
        photo = photos[i % len(photos)]
        size = int(torch.randint(48, 160, (1,), generator=gen))
        top = int(torch.randint(0, photo.shape[1] - size, (1,), generator=gen))
        left = int(torch.randint(0, photo.shape[2] - size, (1,), generator=gen))
        crop = photo[:, top : top + size, left : left + size].unsqueeze(0)  # [1, 3, s, s]
        crop = torch.nn.functional.interpolate(crop, size=shape[1:], mode="area")
        if shape[0] == 1:
            crop = (0.299 * crop[:, 0] + 0.587 * crop[:, 1] + 0.114 * crop[:, 2]).unsqueeze(1)
        out.append(crop)
    return torch.cat(out).clamp(0, 1)


def letter_images(n: int, shape: tuple[int, int, int], seed: int) -> torch.Tensor:
    """Latin letters rendered with Pillow's bundled font (a notMNIST-like OOD set): random letter, size,
    offset and stroke, light on dark like Fashion-MNIST, in [0, 1]."""
    import string

    from PIL import Image, ImageDraw, ImageFont

    gen = torch.Generator().manual_seed(seed)
    letters = string.ascii_letters
    channels, height, width = shape
    out = torch.empty((n, channels, height, width))
    for i in range(n):
        letter = letters[int(torch.randint(len(letters), (1,), generator=gen))]
        size = int(torch.randint(height // 2, height, (1,), generator=gen))
        stroke = int(torch.randint(0, 2, (1,), generator=gen))
        dx, dy = (int(v) for v in torch.randint(-height // 8, height // 8 + 1, (2,), generator=gen))
        image = Image.new("L", (width, height))
        ImageDraw.Draw(image).text((width / 2 + dx, height / 2 + dy), letter, fill=255, anchor="mm",
                                   font=ImageFont.load_default(size=size), stroke_width=stroke, stroke_fill=255)
        out[i] = torch.from_numpy(np.asarray(image, dtype=np.float32) / 255.0).expand(channels, -1, -1)
    return out
