"""A shift kept for fitting only: validation images rotated by a random angle.

What it is for: choosing how DIRECTOR's sampled noise is shaped (``training.export.served_statistics.
fit_noise_shape``) on inputs the model was not distilled on, without fitting on any reported set. No reported
corruption (``training.data.corruptions``) rotates, distillation's augmentation only pads, crops and flips, and the
images are the validation split's, never the test split's.
"""

from __future__ import annotations

import torch
import torchvision.transforms.v2.functional as tvf

from training.data.images import Split

ROTATION_DEGREES = (15.0, 45.0)  # |angle| drawn uniformly in this range, either direction


def rotated(split: Split, seed: int, degrees: tuple[float, float] = ROTATION_DEGREES) -> Split:
    """``split``'s images [N, C, H, W] each rotated about its centre by its own angle (sign and size drawn under
    ``seed``), the uncovered corners filled with the image's own border mean; labels unchanged."""
    generator = torch.Generator().manual_seed(seed)
    low, high = degrees
    sizes = low + (high - low) * torch.rand(len(split), generator=generator)  # [N]
    signs = torch.randint(0, 2, (len(split),), generator=generator) * 2 - 1  # [N] in {-1, 1}
    out = torch.empty_like(split.images)
    for i, (image, angle) in enumerate(zip(split.images, (sizes * signs).tolist(), strict=True)):
        border = torch.cat([image[:, 0], image[:, -1], image[:, :, 0], image[:, :, -1]], dim=1).mean(1)  # [C]
        out[i] = tvf.rotate(image, angle, interpolation=tvf.InterpolationMode.BILINEAR,
                            fill=[float(v) for v in border])
    return Split(out.clamp(0, 1), split.labels)
