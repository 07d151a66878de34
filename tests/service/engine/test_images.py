"""Inputs to pixel tensors (``service.engine.images``): how a PNG or JPEG is decoded and converted, what the pixel
limits refuse before decoding, and which pixel arrays are refused with which status. Images are made in memory."""

from __future__ import annotations

import base64
import io
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from service.engine.images import PixelBudget, decode_base64, image_to_tensor, pixels_to_tensor
from service.errors import ApiError

LOC: list[str | int] = ["inputs", 1, "image_base64"]
LIMIT = 1_000_000


def encoded(mode: str, size: tuple[int, int], colour: Any, kind: str = "PNG") -> bytes:
    buffer = io.BytesIO()
    Image.new(mode, size, colour).save(buffer, format=kind)
    return buffer.getvalue()


def refusal(call: Any, *args: Any) -> ApiError:
    with pytest.raises(ApiError) as error:
        call(*args)
    return error.value


def test_a_png_at_the_models_size_is_its_pixels_over_255() -> None:
    image = Image.fromarray(np.array([[0, 51], [102, 255]], dtype=np.uint8), mode="L")
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    tensor = image_to_tensor(buffer.getvalue(), (1, 2, 2), LIMIT, LOC)
    assert tensor.dtype == torch.float32 and torch.allclose(tensor, torch.tensor([[[0.0, 0.2], [0.4, 1.0]]]))


def test_colour_is_converted_to_luma_and_other_sizes_resized() -> None:
    red = image_to_tensor(encoded("RGB", (5, 3), (255, 0, 0)), (1, 2, 2), LIMIT, LOC)  # 5x3 -> 2x2
    assert red.shape == (1, 2, 2) and torch.allclose(red, torch.full((1, 2, 2), 76 / 255))  # ITU-R 601: 0.299 R
    grey = image_to_tensor(encoded("L", (2, 2), 128), (3, 2, 2), LIMIT, LOC)  # one channel to RGB: repeated
    assert torch.allclose(grey, torch.full((3, 2, 2), 128 / 255))
    jpeg = image_to_tensor(encoded("L", (8, 8), 200, "JPEG"), (1, 2, 2), LIMIT, LOC)
    assert torch.allclose(jpeg, torch.full((1, 2, 2), 200 / 255), atol=3 / 255)  # lossy, but close


def test_transparency_is_composited_onto_black() -> None:
    clear_white = image_to_tensor(encoded("RGBA", (2, 2), (255, 255, 255, 0)), (1, 2, 2), LIMIT, LOC)
    half_white = image_to_tensor(encoded("LA", (2, 2), (255, 128)), (1, 2, 2), LIMIT, LOC)
    assert clear_white.max() == 0.0 and torch.allclose(half_white, torch.full((1, 2, 2), 128 / 255), atol=1 / 255)


def test_what_is_not_a_png_or_jpeg_is_400() -> None:
    for data in (encoded("L", (2, 2), 0, "GIF"), b"not an image at all", b""):
        error = refusal(image_to_tensor, data, (1, 2, 2), LIMIT, LOC)
        assert error.status == 400 and error.message.startswith("inputs.1.image_base64: not a decodable PNG or JPEG")


def test_a_png_whose_data_fails_its_crc_is_400_naming_the_chunk() -> None:
    data = bytearray(encoded("L", (4, 4), 7))
    at = data.index(b"IDAT") + 6  # a byte of the compressed pixels
    data[at] ^= 0xFF
    error = refusal(image_to_tensor, bytes(data), (1, 2, 2), LIMIT, LOC)
    assert error.status == 400 and "PNG chunk 'IDAT'" in error.message and "CRC" in error.message


def test_the_pixel_limit_is_checked_on_the_header_before_decoding() -> None:
    data = encoded("L", (4, 4), 7)
    truncated = data[:data.index(b"IDAT") + 6]  # the header and 2 bytes of pixels: decoding it would fail
    error = refusal(image_to_tensor, truncated, (1, 2, 2), 15, LOC)
    assert error.status == 413 and error.message == (
        "inputs.1.image_base64: image is 4x4 = 16 pixels, the limit is 15")
    assert refusal(image_to_tensor, truncated, (1, 2, 2), 16, LOC).status == 400  # at the limit it is decoded


def test_a_requests_images_share_one_budget_of_decoded_pixels() -> None:
    budget = PixelBudget(limit=40)
    data = encoded("L", (4, 4), 7)
    image_to_tensor(data, (1, 2, 2), LIMIT, ["inputs", 0], budget)
    image_to_tensor(data, (1, 2, 2), LIMIT, ["inputs", 1], budget)
    assert budget.spent == 32
    error = refusal(image_to_tensor, data, (1, 2, 2), LIMIT, ["inputs", 2], budget)
    assert error.status == 413 and error.message.startswith("inputs.2: the request's images hold 48 pixels up to here")


def test_base64_must_be_strict() -> None:
    assert decode_base64(base64.b64encode(b"\x89PNG").decode(), LOC) == b"\x89PNG"
    for text in ("abc$", "abc", "YQ==\n"):
        error = refusal(decode_base64, text, LOC)
        assert error.status == 400 and error.message == "inputs.1.image_base64: image_base64 is not valid base64"
        assert error.details is not None and error.details[0]["loc"] == LOC


def test_pixel_arrays_of_the_models_shape_become_float32() -> None:
    square = [[0.0, 0.25], [0.5, 1.0]]
    assert pixels_to_tensor(square, (1, 2, 2), LOC).tolist() == [square]  # [H, W] for a one-channel model
    tensor = pixels_to_tensor([square] * 3, (3, 2, 2), LOC)
    assert tensor.shape == (3, 2, 2) and tensor.dtype == torch.float32


@pytest.mark.parametrize(("pixels", "shape", "message"), [
    ([[0.0, 0.5]], (1, 2, 2), "pixels have shape [1, 2], expected [2, 2] or [1, 2, 2]"),  # the shape as sent
    ([[0.0, 0.5], [0.5, 0.5]], (3, 2, 2), "pixels have shape [2, 2], expected [3, 2, 2]"),
    ([[0.0, 0.5], [0.5]], (1, 2, 2), "pixels must be a rectangular nested list of numbers"),
    ([["a", 0.5], [0.5, 0.5]], (1, 2, 2), "pixels must be a rectangular nested list of numbers"),
    ([[0.0, 1.5], [-0.25, 0.5]], (1, 2, 2), "pixel values must lie in [0, 1], got [-0.25, 1.5]"),
    ([[0.0, float("nan")], [0.5, 0.5]], (1, 2, 2), "pixels contain NaN or Inf"),
    ([[0.0, float("inf")], [0.5, 0.5]], (1, 2, 2), "pixels contain NaN or Inf"),
    ([[0, 10**400], [0, 0]], (1, 2, 2), "got an integer too large for a float"),
])
def test_a_pixel_array_that_is_not_the_models_input_is_422(pixels: Any, shape: tuple[int, int, int], message: str
                                                           ) -> None:
    error = refusal(pixels_to_tensor, pixels, shape, LOC)
    assert error.status == 422 and message in error.message and error.message.startswith("inputs.1.image_base64: ")
    assert error.details == [{"loc": LOC, "msg": error.message}]


def test_a_refusal_without_a_location_says_input() -> None:
    assert refusal(pixels_to_tensor, [[2.0]], (1, 1, 1), []).message.startswith("input: pixel values must lie")
