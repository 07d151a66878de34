"""The OOD-validation families that choose the served OOD score (docs/method.md, "An OOD score chosen to generalise").

One family decided the score before, and a score chosen on one far-off set does not generalise: on the walk-through
model, licence sentences chose max softmax, which lost to the kernel error on both reported sets. So every export
measures each candidate on several distinct kinds of input, none of them a reported OOD set or a held-out shift, and
serves the one closest to the best on all of them (``training.posthoc.ood_selection``):

- images: crops of scikit-learn's two sample photos (natural images), smooth Gaussian noise (blobs without edges;
  the reported set is uniform pixel noise), validation images with their pixels shuffled (the task's own
  intensities without its shapes) and synthetic patterns (stripes, checkerboards, gradients, flat images: the far-OOD
  kinds of an image, as random strings and markup are of a text);
- texts: Debian software-licence sentences (legal prose), the installed Debian packages' changelog entries (terse
  technical notes; left out where the machine has no package documentation) and lines of Python standard-library code
  (not prose; the reported set is docstring sentences), and the far-OOD kinds of ``training.data.far_ood_texts``
  (random character strings, non-Latin scripts, numbers and tables, markup and URLs), generated from the seed: a
  score chosen on prose-like families alone ranked gibberish as more in-distribution than a product review. The
  package descriptions are not a family: the text model's distillation reads them as unlabeled inputs.

A user's own OOD-validation set (``export.ood_validation_data``) joins them as one more family, weighted by
``export.ood_validation_weight``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tokenizers import Tokenizer
from torchvision.transforms import functional as tvf

from training.config import PipelineConfig
from training.data.far_ood_texts import FAR_OOD_KINDS
from training.data.images import Split, photo_patch_images
from training.data.ood_texts import load_changelog_entries, load_source_code_lines
from training.data.ood_validation import describe, user_ood_images, user_ood_texts
from training.data.tokens import TEXT_OOD_SELECTION_SET, TokenSplit, encode, readable, sample_texts

AnySplit = Split | TokenSplit
USER_FAMILY = "user_ood_validation"
IMAGE_OOD_SELECTION_SET = "sklearn sample-photo patches (OOD validation only)"
MIN_FAMILY_TEXTS = 50  # a built-in text family with fewer texts on this machine is left out
IMAGE_FAMILIES = 4  # the built-in families of each modality (a machine without changelogs has one text family fewer)
TEXT_FAMILIES = 3 + len(FAR_OOD_KINDS)


@dataclass(frozen=True)
class OodFamily:
    split: AnySplit
    description: str  # what the manifest and the pages call it
    weight: float = 1.0  # its regret's weight in the choice


def unlabelled(images: torch.Tensor) -> Split:
    """Images without labels (an OOD set) as a split."""
    return Split(images, torch.zeros(images.shape[0], dtype=torch.long))


def smooth_noise_images(n: int, shape: tuple[int, int, int], seed: int, sigma: float = 2.0) -> torch.Tensor:
    """Gaussian noise blurred with a Gaussian of ``sigma`` pixels, each image stretched to [0, 1]: [n, C, H, W]."""
    noise = torch.randn((n, *shape), generator=torch.Generator().manual_seed(seed))  # [n, C, H, W]
    size = 2 * int(3 * sigma) + 1
    blurred = tvf.gaussian_blur(noise, [size, size], [sigma, sigma])  # [n, C, H, W]
    low = blurred.amin(dim=(1, 2, 3), keepdim=True)
    high = blurred.amax(dim=(1, 2, 3), keepdim=True)
    return (blurred - low) / (high - low).clamp_min(1e-12)


def shuffled_pixel_images(split: Split, n: int, seed: int) -> torch.Tensor:
    """The first ``n`` images of ``split`` with their pixel positions shuffled, one permutation per image (the same
    for every channel): [n, C, H, W]."""
    images = split.first_args(n)[0]  # [n, C, H, W]
    gen = torch.Generator().manual_seed(seed)
    flat = images.flatten(2)  # [n, C, H*W]
    order = torch.stack([torch.randperm(flat.shape[2], generator=gen) for _ in range(flat.shape[0])])  # [n, H*W]
    shuffled = flat.gather(2, order[:, None, :].expand(-1, flat.shape[1], -1))  # [n, C, H*W]
    return shuffled.view_as(images).contiguous()


def pattern_images(n: int, shape: tuple[int, int, int], seed: int) -> torch.Tensor:
    """Synthetic patterns no natural or task image looks like, [n, C, H, W] in [0, 1]: stripes at a random angle and
    frequency, checkerboards of a random cell size, linear gradients and flat images, a quarter each."""
    gen = torch.Generator().manual_seed(seed)
    channels, height, width = shape
    y, x = torch.meshgrid(torch.linspace(0, 1, height), torch.linspace(0, 1, width), indexing="ij")  # [H, W] each
    images = []
    for i in range(n):
        angle, level = float(torch.rand((), generator=gen)) * torch.pi, float(torch.rand((), generator=gen))
        along = x * torch.cos(torch.tensor(angle)) + y * torch.sin(torch.tensor(angle))  # [H, W]
        kind = i % 4
        if kind == 0:
            frequency = 2 + 10 * float(torch.rand((), generator=gen))
            image = 0.5 + 0.5 * torch.sin(2 * torch.pi * frequency * along)  # [H, W]
        elif kind == 1:
            cell = int(torch.randint(2, max(3, height // 3), (), generator=gen))
            rows, cols = torch.arange(height)[:, None] // cell, torch.arange(width)[None, :] // cell
            image = ((rows + cols) % 2).float()  # [H, W]
        elif kind == 2:
            image = (along - along.min()) / (along.max() - along.min()).clamp_min(1e-12)  # [H, W]
        else:
            image = torch.full((height, width), level)  # [H, W]
        images.append(image.expand(channels, height, width))
    return torch.stack(images).contiguous()  # [n, C, H, W]


def image_ood_families(cfg: PipelineConfig, val: Split, shape: tuple[int, int, int]) -> dict[str, OodFamily]:
    """The image families (``export.ood_validation_images`` inputs each), and the user's set when one is named."""
    n, seed = cfg.export.ood_validation_images, cfg.seed
    families = {
        "photo_patches": OodFamily(unlabelled(photo_patch_images(n, shape, seed)), IMAGE_OOD_SELECTION_SET),
        "smooth_noise": OodFamily(unlabelled(smooth_noise_images(n, shape, seed + 11)),
                                  "blurred Gaussian noise (OOD validation only)"),
        "shuffled_pixels": OodFamily(unlabelled(shuffled_pixel_images(val, n, seed + 12)),
                                     "validation images with their pixels shuffled (OOD validation only)"),
        "patterns": OodFamily(unlabelled(pattern_images(n, shape, seed + 13)),
                              "stripes, checkerboards, gradients and flat images (OOD validation only)"),
    }
    user_set = cfg.export.ood_validation_data
    if user_set is not None:
        families[USER_FAMILY] = OodFamily(user_ood_images(user_set, n, shape, seed), describe(user_set),
                                          cfg.export.ood_validation_weight)
    return families


def text_ood_families(cfg: PipelineConfig, tokenizer: Tokenizer, licences: TokenSplit) -> dict[str, OodFamily]:
    """The text families (``licences``: the licence sentences already tokenised, ``export.ood_validation_images``
    texts each), and the user's set when one is named."""
    n, seed, tcfg = cfg.export.ood_validation_images, cfg.seed, cfg.text

    def family(texts: list[str], offset: int) -> TokenSplit:
        return encode(tokenizer, sample_texts(readable(tokenizer, texts), n, seed + offset), tcfg.max_characters)

    families = {"licences": OodFamily(licences, TEXT_OOD_SELECTION_SET)}
    changes = load_changelog_entries()
    if len(changes) >= MIN_FAMILY_TEXTS:
        families["changelogs"] = OodFamily(family(changes, 21),
                                           "Debian package changelog entries (OOD validation only)")
    families["source_code"] = OodFamily(family(load_source_code_lines(), 22),
                                        "lines of Python standard-library code (OOD validation only)")
    for offset, (name, (generate, description)) in enumerate(FAR_OOD_KINDS.items(), start=23):
        split = family(generate(n, seed + offset), offset)
        if len(split) >= min(MIN_FAMILY_TEXTS, max(n // 2, 1)):  # left out where the tokenizer reads too few of them
            families[name] = OodFamily(split, description)
    user_set = cfg.export.ood_validation_data
    if user_set is not None:
        families[USER_FAMILY] = OodFamily(user_ood_texts(user_set, n, tokenizer, tcfg.max_characters, seed),
                                          describe(user_set), cfg.export.ood_validation_weight)
    return families


def selection_description(families: dict[str, OodFamily]) -> str:
    """The manifest's ``ood.selection_set``: every family, in order."""
    return "; ".join(family.description for family in families.values())
