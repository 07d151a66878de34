"""How a decoded image becomes a model's input: the one rule the server applies to a request's image
(``service.engine.images``) and the pipeline to a user's training images (``training.data.sources``), so training
sees what serving sees. PIL and torch only."""

from __future__ import annotations

import zlib

import numpy as np
import torch
from PIL import Image

IMAGE_FORMATS = ["PNG", "JPEG"]  # what the server decodes
RESIZE = "bilinear to height x width, aspect ratio not kept"
IMAGE_CONVERSION = (
    "PNG or JPEG decoded with Pillow (EXIF orientation not applied); transparency (RGBA, LA, PA, a palette with a "
    "transparent colour) composited onto black; converted with PIL to L (1 channel, ITU-R 601 luma) or RGB "
    "(3 channels), 16-bit grey clipped at 255 by PIL; resized with PIL bilinear to height x width when the size "
    "differs (aspect ratio not kept); divided by 255 to float32 in [0, 1], channels first"
)


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_corruption(data: bytes) -> str | None:
    """Why a PNG file is corrupt, or None. Pillow does not check the CRC of image-data chunks, so a file whose pixels
    were damaged in transit would decode into other pixels; both the server and the pipeline refuse it instead (a
    prediction on pixels the client never sent is worse than an error). Non-PNG data and files Pillow itself finds
    truncated pass through to Pillow."""
    if not data.startswith(PNG_SIGNATURE):
        return None
    offset = len(PNG_SIGNATURE)
    while offset + 12 <= len(data):
        length = int.from_bytes(data[offset : offset + 4], "big")
        end = offset + 12 + length  # length, type, data, CRC
        if end > len(data):
            return None
        kind = data[offset + 4 : offset + 8]
        if zlib.crc32(data[offset + 4 : end - 4]) != int.from_bytes(data[end - 4 : end], "big"):
            return f"PNG chunk {kind.decode('latin-1')!r} at byte {offset} fails its CRC check (the file is corrupt)"
        if kind == b"IEND":
            return None
        offset = end
    return None


def convert_image(image: Image.Image, channels: int, height: int, width: int) -> torch.Tensor:
    """A decoded image as the model's input [C, H, W] float32 in [0, 1] (``IMAGE_CONVERSION``)."""
    image = flatten_alpha(image)
    image = image.convert("L" if channels == 1 else "RGB")
    if image.size != (width, height):
        image = image.resize((width, height), Image.Resampling.BILINEAR)
    array = np.asarray(image, dtype=np.float32) / 255.0  # [H, W] or [H, W, 3]
    tensor = torch.from_numpy(array.copy())
    return tensor.unsqueeze(0) if channels == 1 else tensor.permute(2, 0, 1).contiguous()  # [C, H, W]


def flatten_alpha(image: Image.Image) -> Image.Image:
    """Transparency composited onto black (a palette image with a transparent colour first becomes RGBA)."""
    if image.mode == "P":
        image = image.convert("RGBA" if "transparency" in image.info else "RGB")
    if image.mode in ("RGBA", "LA", "PA"):
        background = Image.new("RGBA", image.size, (0, 0, 0, 255))
        return Image.alpha_composite(background, image.convert("RGBA")).convert("RGB")
    return image


def image_convert_fields(channels: int) -> dict[str, str]:
    """The conversion as the manifest's ``input.convert`` section (``artifact.contract.ImageConvert`` fields)."""
    return {"color": "L" if channels == 1 else "RGB", "resize": RESIZE, "note": IMAGE_CONVERSION}
