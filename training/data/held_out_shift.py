"""A shift kept for fitting only: validation images rotated by a random angle, validation texts with typos.

What it is for: choosing how DIRECTOR's sampled noise is shaped (``training.posthoc.served_statistics.
fit_noise_shape``) on inputs the model was not distilled on, without fitting on any reported set (docs/method.md,
"Samples that carry information"). Images: no reported corruption (``training.data.corruptions``) rotates, and
distillation's augmentation only pads, crops and flips. Texts: the reported shifts are other domains (tweets,
editorials, product reviews), not misspellings, and distillation's perturbed copies (``training.data.unlabeled``)
drop and splice whole words, never letters. Both are the validation split's inputs, never the test split's, with
their labels: a rotated garment and a review with typos keep their class.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
import torchvision.transforms.v2.functional as tvf

from training.config import PipelineConfig
from training.data.image_file import ImageFile
from training.data.images import Split
from training.data.tokens import TokenSplit, encode, load_run_tokenizer

ROTATION_DEGREES = (15.0, 45.0)  # |angle| drawn uniformly in this range, either direction
TYPO_RATE = 0.3  # the share of words (of two letters or more) given one typo


@dataclass(frozen=True)
class HeldOutShift:
    split: Split | TokenSplit
    description: str  # what the fit was measured on, for the manifest and the results pages


def held_out_shift(cfg: PipelineConfig, split: Split | TokenSplit) -> HeldOutShift:
    """The held-out shift of ``split`` (validation inputs) under the run's seed: rotated images, or texts with typos
    tokenised with the run's own tokenizer."""
    if isinstance(split, Split):
        return HeldOutShift(rotated(split, cfg.seed), "validation + rotated validation")
    tokenizer = load_run_tokenizer(cfg.run_dir)
    typed = with_typos(split.texts, cfg.seed)
    return HeldOutShift(encode(tokenizer, typed, cfg.text.max_characters, split.labels),
                        "validation + validation with typos")


def rotated(split: Split, seed: int, degrees: tuple[float, float] = ROTATION_DEGREES) -> Split:
    """``split``'s images [N, C, H, W] each rotated about its centre by its own angle (sign and size drawn under
    ``seed``), the uncovered corners filled with the image's own border mean; labels unchanged. A user's images kept
    on disk (``ImageFile``) are rotated into another such file, one image in memory at a time."""
    generator = torch.Generator().manual_seed(seed)
    low, high = degrees
    sizes = low + (high - low) * torch.rand(len(split), generator=generator)  # [N]
    signs = torch.randint(0, 2, (len(split),), generator=generator) * 2 - 1  # [N] in {-1, 1}
    source = split.images
    on_disk = isinstance(source, ImageFile)
    out = ImageFile.create(None, len(split), source.image_shape) if on_disk else torch.empty_like(source)
    for i, angle in enumerate((sizes * signs).tolist()):
        image = source[i]  # [C, H, W]
        border = torch.cat([image[:, 0], image[:, -1], image[:, :, 0], image[:, :, -1]], dim=1).mean(1)  # [C]
        turned = tvf.rotate(image, angle, interpolation=tvf.InterpolationMode.BILINEAR,
                            fill=[float(v) for v in border]).clamp(0, 1)  # [C, H, W]
        if on_disk:
            out.write(i, turned)
        else:
            out[i] = turned
    return Split(out, split.labels)


def with_typos(texts: list[str], seed: int, rate: float = TYPO_RATE) -> list[str]:
    """``texts`` with typos: each word of two letters or more, with probability ``rate``, gets one of three edits
    drawn at random (two neighbouring letters swapped, a letter dropped, a letter doubled); punctuation and spacing
    are kept."""
    rng = random.Random(seed)
    return [" ".join(typo(word, rng) if sum(c.isalpha() for c in word) >= 2 and rng.random() < rate else word
                     for word in text.split(" ")) for text in texts]


def typo(word: str, rng: random.Random) -> str:
    """One edit of ``word`` at one of its letters (``word`` has two letters or more)."""
    letters = [i for i, c in enumerate(word) if c.isalpha()]
    kind = rng.randrange(3)
    if kind == 0:  # swap a letter with the next letter
        pairs = [i for i in letters if i + 1 in letters and word[i] != word[i + 1]]
        if pairs:
            i = rng.choice(pairs)
            return word[:i] + word[i + 1] + word[i] + word[i + 2:]
        kind = 1
    i = rng.choice(letters)
    if kind == 1:  # drop a letter
        return word[:i] + word[i + 1:]
    return word[:i] + word[i] + word[i:]  # double a letter
