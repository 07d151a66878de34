"""Fashion-MNIST-C: common corruptions in the style of CIFAR-10-C (Hendrycks & Dietterich, ICLR 2019),
written here from their definitions and generated deterministically.

Images are float tensors ``[N, C, H, W]`` in [0, 1]. ``corrupt(images, name, severity, seed)`` returns
float32 of the same shape, clipped to [0, 1], on the input's device (the work is done on the CPU, so the
result does not depend on the device). Row i of the output depends only on row i of the input, the
seed and i (each image draws from its own generator), so corrupting a prefix gives the prefix of the
full result. ``corruption_seed(name, severity)`` is the seed of a (type, severity), a stable hash.

Severity parameters, chosen for 28x28 grayscale images (pixel units; the same pixel values are used at
other sizes, pixelate is relative to the size):

| corruption        | parameter                                    | 1    | 2    | 3     | 4    | 5    |
| ----------------- | -------------------------------------------- | ---- | ---- | ----- | ---- | ---- |
| gaussian_noise    | noise std (x + N(0, s^2))                    | 0.03 | 0.05 | 0.07  | 0.10 | 0.14 |
| shot_noise        | photons per unit intensity (Poisson(x l)/l)  | 60   | 25   | 12    | 5    | 2.5  |
| impulse_noise     | fraction of pixels set to 0 or 1 (half each) | 0.01 | 0.02 | 0.035 | 0.05 | 0.08 |
| gaussian_blur     | Gaussian std in pixels                       | 0.5  | 0.7  | 0.9   | 1.2  | 1.5  |
| motion_blur       | std in pixels of a one-sided Gaussian trail  | 1.0  | 1.5  | 2.0   | 3.0  | 4.0  |
| contrast          | factor c: (x - mean) c + mean                | 0.9  | 0.8  | 0.7   | 0.6  | 0.5  |
| elastic_transform | RMS displacement in pixels                   | 1.0  | 1.5  | 2.0   | 2.75 | 3.5  |
| pixelate          | side of the low-resolution image / side      | 0.8  | 0.65 | 0.55  | 0.4  | 0.3  |
| jpeg_compression  | JPEG quality (PIL, libjpeg)                  | 20   | 10   | 6     | 4    | 2    |

Chosen so that the default backbone (runs/fashion-vit, clean accuracy 89.4% on a 500-image subset)
loses accuracy monotonically with severity on every type: roughly 85-88% at severity 1 and 18-55% at
severity 5 (contrast is the harshest: the background turns grey). Pixelate avoids the factor 0.5,
where 28 -> 14 pixels averages aligned 2x2 blocks and hurts less than milder factors.

Definitions: motion blur averages copies of the image shifted 0..ceil(3 s) pixels along a random
direction per image (angle uniform in [-45, 45] degrees, as CIFAR-10-C), weighted by a Gaussian of the
shift, bilinear sampling with edge replication. Elastic transform (Simard et al. 2003): a per-image
displacement field of i.i.d. N(0, 1) values smoothed by a Gaussian of std ``ELASTIC_SMOOTHING`` pixels
and rescaled to the RMS displacement above, bilinear sampling with edge replication (CIFAR-10-C's extra
random affine part is left out). Pixelate: area-average down to round(side * f) pixels, nearest-neighbour
back up. JPEG: 8-bit quantisation, grayscale (one channel) or RGB (three channels) encoding, each
channel separately otherwise; bit-identity of this one needs the same libjpeg build. Contrast: per-image,
per-channel mean over the pixels. Noise types are drawn per pixel and channel.
"""

from __future__ import annotations

import hashlib
import io
import math
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as tf
import torchvision.transforms.v2.functional as tvf
from PIL import Image

CORRUPTIONS: tuple[str, ...] = (
    "gaussian_noise", "shot_noise", "impulse_noise", "gaussian_blur", "motion_blur", "contrast",
    "elastic_transform", "pixelate", "jpeg_compression",
)
SEVERITIES: tuple[int, ...] = (1, 2, 3, 4, 5)

PARAMETERS: dict[str, tuple[float, ...]] = {
    "gaussian_noise": (0.03, 0.05, 0.07, 0.10, 0.14),
    "shot_noise": (60, 25, 12, 5, 2.5),
    "impulse_noise": (0.01, 0.02, 0.035, 0.05, 0.08),
    "gaussian_blur": (0.5, 0.7, 0.9, 1.2, 1.5),
    "motion_blur": (1.0, 1.5, 2.0, 3.0, 4.0),
    "contrast": (0.9, 0.8, 0.7, 0.6, 0.5),
    "elastic_transform": (1.0, 1.5, 2.0, 2.75, 3.5),
    "pixelate": (0.8, 0.65, 0.55, 0.4, 0.3),
    "jpeg_compression": (20, 10, 6, 4, 2),
}
PARAMETER_MEANING: dict[str, str] = {
    "gaussian_noise": "noise std",
    "shot_noise": "photons per unit intensity",
    "impulse_noise": "fraction of pixels set to 0 or 1",
    "gaussian_blur": "Gaussian std (pixels)",
    "motion_blur": "trail Gaussian std (pixels), random angle in [-45, 45] degrees",
    "contrast": "contrast factor",
    "elastic_transform": "RMS displacement (pixels), field smoothed with std 3 pixels",
    "pixelate": "low-resolution side / side",
    "jpeg_compression": "JPEG quality",
}
ELASTIC_SMOOTHING = 3.0
MOTION_MAX_ANGLE = 45.0


def _check(name: str, severity: int) -> None:
    if name not in CORRUPTIONS:
        raise ValueError(f"unknown corruption {name!r}; valid: {', '.join(CORRUPTIONS)}")
    if isinstance(severity, bool) or severity not in SEVERITIES:
        raise ValueError(f"invalid severity {severity!r} for {name}; valid: {', '.join(map(str, SEVERITIES))}")


def _stable_int(*parts: object) -> int:
    """A 63-bit integer from a SHA-256 of the parts (stable across processes, unlike hash())."""
    digest = hashlib.sha256("/".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def corruption_seed(name: str, severity: int, base_seed: int = 0) -> int:
    """The seed of one (type, severity), derived from its name, severity and a base seed."""
    _check(name, severity)
    return _stable_int("fashion-mnist-c", name, int(severity), int(base_seed))


def corruption_subset(n_total: int, n: int, seed: int = 0) -> torch.Tensor:
    """A fixed, sorted subset of ``n`` of ``n_total`` test indices (int64), the same for every type and severity."""
    if not 0 <= n <= n_total:
        raise ValueError(f"cannot take {n} of {n_total} indices")
    order = torch.randperm(n_total, generator=torch.Generator().manual_seed(seed))
    return order[:n].sort().values


def _per_image(n: int, seed: int, draw: Callable[[torch.Generator, int], torch.Tensor]) -> torch.Tensor:
    """Stack ``draw(generator, i)`` over images i, each with its own generator seeded from (seed, i)."""
    return torch.stack([draw(torch.Generator().manual_seed(_stable_int(seed, i)), i) for i in range(n)])


def _base_grid(n: int, h: int, w: int) -> torch.Tensor:
    """Identity sampling grid [N, H, W, 2] in grid_sample's normalised (x, y) coordinates, align_corners=False."""
    ys = (torch.arange(h, dtype=torch.float32) * 2 + 1) / h - 1
    xs = (torch.arange(w, dtype=torch.float32) * 2 + 1) / w - 1
    grid = torch.stack(torch.meshgrid(xs, ys, indexing="xy"), -1)  # [H, W, 2] as (x, y)
    return grid.expand(n, h, w, 2)


def _sample(x: torch.Tensor, displacement: torch.Tensor) -> torch.Tensor:
    """Bilinear sampling of x at (pixel + displacement), displacement [N, H, W, 2] in pixels (x, y)."""
    n, _, h, w = x.shape
    scale = torch.tensor([2.0 / w, 2.0 / h])
    grid = _base_grid(n, h, w) + displacement * scale
    return tf.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)


def _gaussian_kernel_size(sigma: float, h: int, w: int) -> int:
    """Odd kernel covering +-3 sigma, capped so reflect padding fits the image."""
    radius = max(1, min(math.ceil(3 * sigma), h - 1, w - 1))
    return 2 * radius + 1


def _blur(x: torch.Tensor, sigma: float) -> torch.Tensor:
    if min(x.shape[-2:]) < 2:
        return x
    k = _gaussian_kernel_size(sigma, *x.shape[-2:])
    return tvf.gaussian_blur(x, kernel_size=[k, k], sigma=[sigma, sigma])


def _gaussian_noise(x: torch.Tensor, s: float, seed: int) -> torch.Tensor:
    noise = _per_image(x.shape[0], seed, lambda g, _: torch.randn(x.shape[1:], generator=g))
    return x + s * noise


def _shot_noise(x: torch.Tensor, photons: float, seed: int) -> torch.Tensor:
    rates = x.double() * photons
    counts = _per_image(x.shape[0], seed, lambda g, i: torch.poisson(rates[i], generator=g))
    return (counts / photons).float()


def _impulse_noise(x: torch.Tensor, amount: float, seed: int) -> torch.Tensor:
    u = _per_image(x.shape[0], seed, lambda g, _: torch.rand(x.shape[1:], generator=g))
    out = x.clone()
    out[u < amount / 2] = 0.0
    out[u >= 1 - amount / 2] = 1.0
    return out


def _gaussian_blur(x: torch.Tensor, sigma: float, seed: int) -> torch.Tensor:
    return _blur(x, sigma)


def _motion_blur(x: torch.Tensor, sigma: float, seed: int) -> torch.Tensor:
    n = x.shape[0]
    angles = _per_image(n, seed, lambda g, _: (torch.rand((), generator=g) * 2 - 1) * math.radians(MOTION_MAX_ANGLE))
    direction = torch.stack([angles.cos(), angles.sin()], -1).view(n, 1, 1, 2)
    taps = torch.arange(math.ceil(3 * sigma) + 1, dtype=torch.float32)
    weights = torch.exp(-taps.square() / (2 * sigma**2))
    weights = weights / weights.sum()
    out = torch.zeros_like(x)
    for d, wt in zip(taps.tolist(), weights.tolist(), strict=True):
        out += wt * (x if d == 0 else _sample(x, -d * direction.expand(n, *x.shape[-2:], 2)))
    return out


def _contrast(x: torch.Tensor, c: float, seed: int) -> torch.Tensor:
    mean = x.mean(dim=(-2, -1), keepdim=True)
    return (x - mean) * c + mean


def _elastic_transform(x: torch.Tensor, alpha: float, seed: int) -> torch.Tensor:
    n, _, h, w = x.shape
    field = _per_image(n, seed, lambda g, _: torch.randn(2, h, w, generator=g))  # [N, 2, H, W] as (dx, dy)
    field = _blur(field, ELASTIC_SMOOTHING)
    rms = field.square().sum(1).mean(dim=(-2, -1)).sqrt().clamp_min(1e-12).view(n, 1, 1, 1)
    field = field * (alpha / rms)
    return _sample(x, field.permute(0, 2, 3, 1))


def _pixelate(x: torch.Tensor, fraction: float, seed: int) -> torch.Tensor:
    h, w = x.shape[-2:]
    small = tf.interpolate(x, size=(max(1, round(h * fraction)), max(1, round(w * fraction))), mode="area")
    return tf.interpolate(small, size=(h, w), mode="nearest")


def _jpeg(array: np.ndarray, quality: int) -> np.ndarray:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="JPEG", quality=int(quality))
    buffer.seek(0)
    with Image.open(buffer) as decoded:
        return np.asarray(decoded.convert("RGB" if array.ndim == 3 else "L"))


def _jpeg_compression(x: torch.Tensor, quality: float, seed: int) -> torch.Tensor:
    pixels = (x * 255).round().to(torch.uint8).numpy()  # [N, C, H, W]
    out = np.empty_like(pixels)
    for i in range(pixels.shape[0]):
        if pixels.shape[1] == 3:
            out[i] = _jpeg(np.ascontiguousarray(pixels[i].transpose(1, 2, 0)), int(quality)).transpose(2, 0, 1)
        else:
            for ch in range(pixels.shape[1]):
                out[i, ch] = _jpeg(np.ascontiguousarray(pixels[i, ch]), int(quality))
    return torch.from_numpy(out).float() / 255


_FUNCTIONS: dict[str, Callable[[torch.Tensor, float, int], torch.Tensor]] = {
    "gaussian_noise": _gaussian_noise, "shot_noise": _shot_noise, "impulse_noise": _impulse_noise,
    "gaussian_blur": _gaussian_blur, "motion_blur": _motion_blur, "contrast": _contrast,
    "elastic_transform": _elastic_transform, "pixelate": _pixelate, "jpeg_compression": _jpeg_compression,
}


def corrupt(images: torch.Tensor, name: str, severity: int, seed: int | None = None) -> torch.Tensor:
    """``images`` [N, C, H, W] in [0, 1] corrupted by ``name`` at ``severity`` (1..5): float32, same shape
    and device, clipped to [0, 1]. The same inputs and seed give a bit-identical result. ``seed`` defaults
    to ``corruption_seed(name, severity)``."""
    _check(name, severity)
    if images.ndim != 4 or not images.is_floating_point():
        raise ValueError(f"images must be a float tensor [N, C, H, W], got {tuple(images.shape)} {images.dtype}")
    if seed is None:
        seed = corruption_seed(name, severity)
    x = images.detach().to("cpu", torch.float32).clamp(0.0, 1.0).contiguous()
    if x.shape[0] == 0:
        return x.to(images.device)
    out = _FUNCTIONS[name](x, PARAMETERS[name][severity - 1], int(seed))
    return out.clamp_(0.0, 1.0).to(images.device).contiguous()
