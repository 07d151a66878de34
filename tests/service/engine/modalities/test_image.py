"""Image models' two halves (``service.engine.modalities.image``): the decoder turning a request's mixed inputs into
one pixel batch in order, and the runner joining, cutting, pricing and running batches, padded to shape buckets
where the device pads (a recording function stands in for the model)."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from artifact.contract import TOKENIZER
from service.engine.artifact import validate_manifest
from service.engine.device import Device
from service.engine.modalities import image
from service.engine.modalities.base import Base64Image, EncodedImage, InputLimits, PixelValues, Text
from service.engine.modalities.image import ImageBatch, ImageDecoder, ImageRunner, pad_pixels
from service.engine.shapes import BatchShapes, Padding
from service.errors import ApiError
from tests.service.engine.fakes import SHAPE, images, manifest

LIMITS = InputLimits(max_text_chars=100, max_image_pixels=1000, max_request_pixels=1000)


def png(value: int, size: tuple[int, int] = (2, 2)) -> bytes:
    buffer = io.BytesIO()
    Image.new("L", size, value).save(buffer, format="PNG")
    return buffer.getvalue()


def firsts(batch: ImageBatch) -> list[float]:
    """Each input's first pixel, rounded: which input is where."""
    return [round(v, 3) for v in batch.pixels.flatten(1)[:, 0].tolist()]


def test_a_requests_mixed_inputs_become_one_batch_in_order() -> None:
    decoder = ImageDecoder(SHAPE)
    batched = np.full((2, *SHAPE), 0.5, dtype=np.float64)  # an OIP tensor of two inputs
    items = [Base64Image(base64.b64encode(png(51)).decode(), ["inputs", 0]), EncodedImage(png(102, (4, 4)), ["file"]),
             PixelValues([[0.25, 0.0], [0.0, 0.0]], ["inputs", 2]), PixelValues(batched, ["inputs"], batched=True)]
    batch = decoder.decode(items, LIMITS, "m")
    assert batch.size == 5 and batch.pixels.shape == (5, *SHAPE) and batch.pixels.dtype == torch.float32
    assert firsts(batch) == [0.2, 0.4, 0.25, 0.5, 0.5]
    assert decoder.tensor.datatype == "FP32" and decoder.tensor.dims == SHAPE and decoder.tensor.layout == "FORMAT_NCHW"
    assert decoder.describe() == "pixels [1, 2, 2], or a PNG or JPEG image"


def test_a_requests_images_share_its_pixel_budget() -> None:
    limits = InputLimits(max_text_chars=100, max_image_pixels=16, max_request_pixels=40)
    files = [EncodedImage(png(0, (4, 4)), ["files", i]) for i in range(3)]
    assert ImageDecoder(SHAPE).decode(files[:2], limits, "m").size == 2
    with pytest.raises(ApiError, match="^files.2: the request's images hold 48 pixels"):
        ImageDecoder(SHAPE).decode(files, limits, "m")


@pytest.mark.parametrize("shape", [(2, 1, 3, 3), (0, *SHAPE), SHAPE])
def test_a_batched_tensor_of_another_shape_is_422(shape: tuple[int, ...]) -> None:
    with pytest.raises(ApiError, match=r"must be \[N, 1, 2, 2\] with N >= 1") as error:
        ImageDecoder(SHAPE).decode([PixelValues(np.zeros(shape), ["inputs", 0], batched=True)], LIMITS, "m")
    assert error.value.status == 422


def test_texts_are_refused_before_any_image_is_decoded() -> None:
    items = [EncodedImage(b"not an image", ["files", 0]), Text("hi", ["inputs", 1, "text"])]
    with pytest.raises(ApiError) as error:  # a 422 for the text, not a 400 for the bytes
        ImageDecoder(SHAPE).decode(items, LIMITS, "fashion")
    assert error.value.status == 422 and "need a text model" in error.value.message


def test_load_reads_the_manifests_image_shape_and_refuses_a_text_section(tmp_path: Path) -> None:
    modality = image.load(manifest(), tmp_path)
    assert isinstance(modality.runner, ImageRunner) and modality.runner.shape == SHAPE
    text = validate_manifest({**manifest().model_dump(mode="json", exclude_none=True), "modality": "text",
                              "input": {"tokenizer": TOKENIZER, "max_length": 8, "max_characters": 10,
                                        "padding": {"pad_id": 0}},
                              "files": {"director.ts": {"sha256": "0" * 64}, TOKENIZER: {"sha256": "0" * 64}}})
    with pytest.raises(ValueError, match="an image model's manifest needs an image input section"):
        image.load(text, tmp_path)


def test_batches_join_and_part_in_order_and_cost_their_rows() -> None:
    runner = ImageRunner(SHAPE)
    joined = runner.join([images(0.1, 0.2), images(0.3)])
    assert firsts(joined) == [0.1, 0.2, 0.3] and firsts(runner.part(joined, 1, 3)) == [0.2, 0.3]
    cost = runner.batch_cost(max_batch_samples=16, max_batch_tokens=4)  # the token budget is for texts
    assert (cost.budget, cost.setting, cost.max_rows) == (16, "max_batch_samples", 16)
    assert runner.example()[0].shape == (2, *SHAPE) and runner.filler(4, 8, cost)[0].shape == (4, *SHAPE)
    assert float(runner.filler(4, 8, cost)[0].abs().sum()) == 0.0


class Recorder:
    """A model whose rows for input i are ``[v, i]`` (v its first pixel, i its position in the forward), with one
    per-input score v; records every forward's (first pixels, repeats)."""

    def __init__(self) -> None:
        self.forwards: list[tuple[list[float], list[int]]] = []

    def __call__(self, pixels: torch.Tensor, repeats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        values = pixels.flatten(1)[:, 0]  # [B]
        self.forwards.append(([round(v, 3) for v in values.tolist()], repeats.tolist()))
        rows = torch.stack([values, torch.arange(len(values), dtype=torch.float32)], 1)  # [B, 2]
        return rows.repeat_interleave(repeats, 0), values[:, None]  # [sum(repeats), 2], [B, 1]


@pytest.mark.parametrize(("budget", "forwards"), [
    (8, [([0.1, 0.2, 0.3, 0.0], [2, 1, 5, 0])]),  # 3 inputs -> 4 (a zero image), 5 rows -> 8 (to the last real one)
    (4, [([0.1, 0.2], [2, 2]), ([0.3], [2])]),  # cut at the budget; 3 rows -> 4
])
def test_forwards_are_cut_to_the_budget_padded_to_buckets_and_trimmed_back(
        budget: int, forwards: list[tuple[list[float], list[int]]]) -> None:
    runner, model = ImageRunner(SHAPE), Recorder()
    device = Device(torch.device("cpu"), shapes=BatchShapes(budget, 2048, buckets=True))
    out = runner.forward(model, device, images(0.1, 0.2, 0.3), [2, 1, 2], runner.batch_cost(budget, 0), seed=None)
    assert model.forwards == forwards
    assert out.rows.shape == (5, 2) and [round(v, 3) for v in out.rows[:, 0].tolist()] == [0.1, 0.1, 0.2, 0.3, 0.3]
    assert out.scores is not None and [round(v, 3) for v in out.scores[:, 0].tolist()] == [0.1, 0.2, 0.3]
    assert out.tokens is None and out.padded_length is None


def test_zero_images_are_added_only_where_the_padding_asks() -> None:
    pixels = images(0.5).pixels
    assert pad_pixels(pixels, Padding(1, 4, 1, 4)) is pixels
    padded = pad_pixels(pixels, Padding(4, 4, 1, 4))
    assert padded.shape == (4, *SHAPE) and padded[0].equal(pixels[0]) and float(padded[1:].abs().sum()) == 0.0
