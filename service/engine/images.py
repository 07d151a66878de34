"""Inputs to pixel tensors in the manifest's layout: float32 ``[C, H, W]`` in [0, 1].

Conversion (documented in docs/api.md and the OpenAPI schema):
- encoded images (PNG or JPEG only): the header's width x height is checked against the pixel limit, and the
  request's images together against its budget of decoded pixels, *before* the image is decoded; transparency is
  composited onto black (the Fashion-MNIST convention is a light object on a dark background); colour is converted
  with PIL to ``L`` (1 channel, ITU-R 601 luma) or ``RGB`` (3 channels); a different size is resized bilinearly to
  height x width (aspect ratio not kept); values are divided by 255.
- pixel arrays: ``[H, W]`` (1-channel models) or ``[C, H, W]`` with exactly the manifest's size, values
  finite and in [0, 1]; no resizing (an array of the wrong shape is refused with 422).
"""

from __future__ import annotations

import base64
import binascii
import io
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from models.image_input import IMAGE_FORMATS, convert_image, png_corruption
from service.errors import ApiError, bad_input, invalid, too_large


@dataclass
class PixelBudget:
    """The decoded pixels one request's images may hold together (``DIRECTOR_MAX_REQUEST_PIXELS``): many images, each
    under the per-image limit, must not add up to seconds of decoding."""

    limit: int
    spent: int = 0

    def spend(self, width: int, height: int, loc: list[str | int]) -> None:
        self.spent += width * height
        if self.spent > self.limit:
            raise too_large(f"{_where(loc)}: the request's images hold {self.spent} pixels up to here, over the "
                            f"limit of {self.limit} decoded pixels per request")


def decode_base64(data: str, loc: list[str | int]) -> bytes:
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ApiError(400, f"{_where(loc)}: image_base64 is not valid base64", [{"loc": loc, "msg": str(exc)}]
                       ) from exc


def image_to_tensor(data: bytes, shape: tuple[int, int, int], max_pixels: int, loc: list[str | int],
                    budget: PixelBudget | None = None) -> torch.Tensor:
    channels, height, width = shape
    corrupt = png_corruption(data)
    if corrupt is not None:
        raise bad_input(f"{_where(loc)}: {corrupt}")
    try:
        image = Image.open(io.BytesIO(data), formats=IMAGE_FORMATS)  # reads the header only
        if image.width * image.height > max_pixels:
            raise too_large(f"{_where(loc)}: image is {image.width}x{image.height} = "
                            f"{image.width * image.height} pixels, the limit is {max_pixels}")
        if budget is not None:
            budget.spend(image.width, image.height, loc)
        image.load()
    except ApiError:
        raise
    except Image.DecompressionBombError as exc:
        # Pillow refuses more than twice its MAX_IMAGE_PIXELS (2 x 89 M) inside open(), before the header check above
        # can run (below that it only warns, and the check above decides)
        raise too_large(f"{_where(loc)}: image is over Pillow's decompression-bomb limit ({exc}); the limit is "
                        f"{max_pixels} pixels") from exc
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        raise bad_input(f"{_where(loc)}: not a decodable PNG or JPEG image ({type(exc).__name__})") from exc
    return convert_image(image, channels, height, width)  # [C, H, W]


def pixels_to_tensor(pixels: Any, shape: tuple[int, int, int], loc: list[str | int]) -> torch.Tensor:
    channels, height, width = shape
    array = float_array(pixels, loc, "pixels must be a rectangular nested list of numbers")
    sent = list(array.shape)  # as the client sent it, for the error
    if array.ndim == 2 and channels == 1:
        array = array[None]
    if array.shape != (channels, height, width):
        expected = f"[{height}, {width}] or " if channels == 1 else ""
        raise invalid(f"{_where(loc)}: pixels have shape {sent}, expected {expected}"
                      f"[{channels}, {height}, {width}]", loc)
    check_values(array, loc)
    return torch.from_numpy(array.astype(np.float32))


def float_array(data: Any, loc: list[str | int], shape_message: str) -> np.ndarray:
    """``data`` (JSON numbers) as float64, so that no value is rounded to inf on the way in and the range check sees
    what was sent. An integer beyond any float (JSON allows ``1`` followed by 400 zeros) is a value out of range."""
    try:
        return np.asarray(data, dtype=np.float64)
    except OverflowError as exc:
        raise invalid(f"{_where(loc)}: pixel values must lie in [0, 1], got an integer too large for a float",
                      loc) from exc
    except (ValueError, TypeError) as exc:
        raise invalid(f"{_where(loc)}: {shape_message}", loc) from exc


def check_values(array: np.ndarray, loc: list[str | int]) -> None:
    if not np.isfinite(array).all():
        raise invalid(f"{_where(loc)}: pixels contain NaN or Inf", loc)
    low, high = float(array.min(initial=0.0)), float(array.max(initial=0.0))
    if low < 0.0 or high > 1.0:
        raise invalid(f"{_where(loc)}: pixel values must lie in [0, 1], got [{low:.4g}, {high:.4g}]", loc)


def _where(loc: list[str | int]) -> str:
    return ".".join(str(part) for part in loc) if loc else "input"


def finite(value: float) -> bool:
    return math.isfinite(value)
