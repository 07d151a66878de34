"""Image models: PNG / JPEG inputs (base64 in JSON, or bytes from an upload) converted as the pipeline converts a
user's training images (``models.image_input``), or pixel arrays already at the model's shape (``ImageDecoder``); a
batch is one float32 tensor [n, C, H, W] in [0, 1], costed in sampled rows (``ImageRunner``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from artifact.contract import Manifest, TextInput
from service.engine.batch_cost import BatchCost
from service.engine.device import Device
from service.engine.images import PixelBudget, decode_base64, image_to_tensor, pixels_to_tensor
from service.engine.inference import Chunk, chunks_by_cost, run_forwards
from service.engine.modalities.base import (
    Base64Image,
    BatchRunner,
    EncodedImage,
    Forward,
    InputBatch,
    InputDecoder,
    InputLimits,
    Modality,
    PixelValues,
    RawInput,
    RowsFunction,
    TensorSpec,
)
from service.engine.shapes import Padding
from service.errors import invalid


@dataclass(frozen=True)
class ImageBatch(InputBatch):
    pixels: torch.Tensor  # [n, C, H, W] float32 in [0, 1]
    size: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", int(self.pixels.shape[0]))


def pad_pixels(pixels: torch.Tensor, padding: Padding) -> torch.Tensor:
    """``[b, C, H, W]`` -> ``[padding.inputs, C, H, W]`` with zero images after the real ones."""
    extra = padding.inputs - padding.real_inputs
    if extra == 0:
        return pixels
    return torch.cat([pixels, pixels.new_zeros((extra, *pixels.shape[1:]))])  # [inputs, C, H, W]


def load(manifest: Manifest, folder: Path) -> Modality:
    """An image model's decoder and runner, at its manifest's input shape."""
    spec = manifest.input
    if isinstance(spec, TextInput):
        raise ValueError("an image model's manifest needs an image input section")
    shape = (spec.channels, spec.height, spec.width)
    return Modality(ImageDecoder(shape), ImageRunner(shape))


class ImageDecoder(InputDecoder):
    modality = "image"
    takes = (Base64Image, EncodedImage, PixelValues)

    def __init__(self, shape: tuple[int, int, int]) -> None:
        self.shape = shape  # (channels, height, width)
        self.tensor = TensorSpec("pixels", "FP32", shape, ("FP64", "FP16", "UINT8"), "FORMAT_NCHW")

    def describe(self) -> str:
        return f"pixels [{', '.join(map(str, self.shape))}], or a PNG or JPEG image"

    def decode(self, items: Sequence[RawInput], limits: InputLimits, model: str) -> ImageBatch:
        self.check_kinds(items, model)
        budget = PixelBudget(limits.max_request_pixels)
        tensors = []
        for item in items:
            if isinstance(item, Base64Image | EncodedImage):
                data = decode_base64(item.data, item.loc) if isinstance(item, Base64Image) else item.data
                tensors.append(image_to_tensor(data, self.shape, limits.max_image_pixels, item.loc, budget)[None])
            elif isinstance(item, PixelValues) and item.batched:
                tensors.append(self.batched_pixels(item))
            elif isinstance(item, PixelValues):
                tensors.append(pixels_to_tensor(item.values, self.shape, item.loc)[None])
        return ImageBatch(torch.cat(tensors))  # [n, C, H, W]

    def batched_pixels(self, item: PixelValues) -> torch.Tensor:
        """An OIP tensor [N, C, H, W] (its values already checked by the protocol) at the model's shape."""
        array = item.values
        if array.ndim != 4 or tuple(array.shape[1:]) != self.shape or array.shape[0] < 1:
            raise invalid(f"pixels shape {list(array.shape)} must be [N, {', '.join(map(str, self.shape))}] with "
                          "N >= 1", item.loc)
        return torch.from_numpy(array.astype("float32"))  # [N, C, H, W]


class ImageRunner(BatchRunner):
    def __init__(self, shape: tuple[int, int, int]) -> None:
        self.shape = shape  # (channels, height, width)

    def join(self, batches: Sequence[InputBatch]) -> ImageBatch:
        return ImageBatch(torch.cat([batch.pixels for batch in batches if isinstance(batch, ImageBatch)]))

    def part(self, batch: InputBatch, start: int, stop: int) -> ImageBatch:
        assert isinstance(batch, ImageBatch)
        return ImageBatch(batch.pixels[start:stop])

    def batch_cost(self, max_batch_samples: int, max_batch_tokens: int) -> BatchCost:
        return BatchCost(max_batch_samples, "max_batch_samples", "sampled rows (inputs x n_samples)")

    def forward(self, model: RowsFunction, device: Device, batch: InputBatch, repeats: list[int], cost: BatchCost,
                seed: int | None) -> Forward:
        assert isinstance(batch, ImageBatch)

        def chunks() -> list[Chunk]:
            out, max_rows = [], cost.max_rows
            for part in chunks_by_cost(repeats, [0] * len(repeats), cost):
                padding = device.shapes.padding(repeats[part], max_rows)
                counts = padding.repeats(repeats[part])  # [inputs]
                out.append(Chunk((pad_pixels(batch.pixels[part], padding), counts), padding))
            return out

        rows, scores = run_forwards(model, device, chunks(), seed)
        return Forward(rows, scores)

    def example(self) -> tuple[torch.Tensor, ...]:
        return (torch.zeros(2, *self.shape),)  # [2, C, H, W]

    def filler(self, inputs: int, rows: int, cost: BatchCost) -> tuple[torch.Tensor, ...]:
        return (torch.zeros(inputs, *self.shape),)  # [inputs, C, H, W]
