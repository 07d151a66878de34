"""Images kept on disk, read per batch: a user's image folder can be far larger than memory (ViT-B/16 inputs are 588 KiB
each as float32), so decoded images are written once as 8 bits per value and every batch reads only its own rows.

8 bits lose nothing: a PNG or JPEG decodes to 8-bit values and the model's input is that value / 255
(``models.image_input``). Reads use ``os.pread``, not a memory map, so the pages read stay in the kernel's cache and
out of the process's resident memory.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import torch

Shape = tuple[int, int, int]  # (C, H, W)


class ImageFile:
    """Images [N, C, H, W] stored as uint8 rows of one file. Indexing as a tensor is indexed: an index tensor (or an
    int) reads those rows as float32 in [0, 1]; a slice is a view, as a tensor's is, reading nothing."""

    dtype = torch.float32

    def __init__(self, path: Path, count: int, image_shape: Shape, rows: torch.Tensor | None = None,
                 keep: object = None) -> None:
        self.path = Path(path)
        self.count = count  # rows in the file
        self.image_shape = image_shape
        self.rows = torch.arange(count) if rows is None else rows  # [N] file rows of this view
        self.row_bytes = int(np.prod(image_shape))
        self._keep = keep  # what must live as long as the file (a temporary folder)

    @classmethod
    def create(cls, path: Path | None, count: int, image_shape: Shape) -> ImageFile:
        """An empty file for ``count`` images (in a temporary folder, removed with the last view, when no path)."""
        keep = None
        if path is None:
            keep = tempfile.TemporaryDirectory(prefix="images-")
            path = Path(keep.name) / "images.u8"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as handle:
            handle.truncate(count * int(np.prod(image_shape)))
        return cls(path, count, image_shape, keep=keep)

    def write(self, row: int, image: torch.Tensor) -> None:
        """Store image [C, H, W] float in [0, 1] (k / 255 values, as decoded) at file row ``row``; thread-safe."""
        values = image.mul(255.0).round_().clamp_(0, 255).to(torch.uint8).numpy().tobytes()
        fd = os.open(self.path, os.O_WRONLY)
        try:
            os.pwrite(fd, values, row * self.row_bytes)
        finally:
            os.close(fd)

    @property
    def shape(self) -> torch.Size:
        return torch.Size((len(self.rows), *self.image_shape))

    def __len__(self) -> int:
        return len(self.rows)

    def view(self, index: torch.Tensor) -> ImageFile:
        """Rows ``index`` of this view as a view, reading nothing."""
        return ImageFile(self.path, self.count, self.image_shape, self.rows[index], self._keep)

    def __getitem__(self, index: torch.Tensor | slice | int) -> torch.Tensor | ImageFile:
        if isinstance(index, slice):
            return ImageFile(self.path, self.count, self.image_shape, self.rows[index], self._keep)
        if isinstance(index, int):
            return self.read(self.rows[index : index + 1] if index >= 0 else self.rows[index:][:1])[0]
        return self.read(self.rows[index])

    def read(self, rows: torch.Tensor) -> torch.Tensor:
        """File rows ``rows`` [b] as float32 [b, C, H, W] in [0, 1]; runs of consecutive rows in one read each."""
        out = np.empty((len(rows), self.row_bytes), dtype=np.uint8)
        wanted = rows.tolist()
        fd = os.open(self.path, os.O_RDONLY)
        try:
            start = 0
            while start < len(wanted):
                end = start + 1
                while end < len(wanted) and wanted[end] == wanted[end - 1] + 1:
                    end += 1
                size = (end - start) * self.row_bytes
                data = os.pread(fd, size, wanted[start] * self.row_bytes)
                if len(data) != size:
                    raise OSError(f"{self.path}: short read (the image file was changed while in use)")
                out[start:end] = np.frombuffer(data, dtype=np.uint8).reshape(end - start, self.row_bytes)
                start = end
        finally:
            os.close(fd)
        pixels = torch.from_numpy(out).view(len(rows), *self.image_shape)  # [b, C, H, W] uint8
        return pixels.float().div_(255.0)
