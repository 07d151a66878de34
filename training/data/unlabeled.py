"""Inputs without labels for distillation (docs/method.md, "Recipe"): the teacher's trajectory exists for any
input, so the kernel also learns on perturbed copies of the training inputs, where the teacher is less sure and the
kernel's own error grows. Never the evaluation's sets or corruption types: images are blended pairs and
translated/flipped (the backbone's own training augmentation); texts lose words, get cropped, or join halves of
two training sentences (mixed, often contradictory sentiment). Texts can also come from an unlabeled corpus that is
none of the evaluation's sets (``UNLABELED_CORPORA``).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from tokenizers import Tokenizer

from training.data.images import Split, augment
from training.data.ood_texts import sentences
from training.data.tokens import TokenSplit, encode

DPKG_STATUS = Path("/var/lib/dpkg/status")


def perturbed_images(images: torch.Tensor, copies: int, seed: int) -> Split:
    """``copies`` perturbed copies of ``images`` [N, C, H, W]: each a blend of two translated/flipped training images
    (weight of the first in [0.5, 1]: from nearly clean to fully ambiguous). Labels are 0: only the teacher's
    output is used."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(copies):
        first = augment(images, gen)  # [N, C, H, W]
        second = augment(images[torch.randperm(images.shape[0], generator=gen)], gen)  # [N, C, H, W]
        weight = 0.5 + 0.5 * torch.rand(images.shape[0], 1, 1, 1, generator=gen)  # [N, 1, 1, 1]
        out.append(weight * first + (1 - weight) * second)
    blended = torch.cat(out)  # [copies * N, C, H, W]
    return Split(blended, torch.zeros(blended.shape[0], dtype=torch.long))


def perturb_text(text: str, other: str, rng: random.Random) -> str:
    """One perturbation of ``text``, drawn at random: drop each word with p = 0.25 (at least one), keep a random half,
    or join its first half with the second half of ``other``."""
    words, others = text.split(), other.split()
    kind = rng.randrange(3)
    if kind == 0:
        kept = [w for w in words if rng.random() >= 0.25]
        if len(kept) == len(words) > 1:  # nothing dropped: drop one word, so every copy differs
            kept.pop(rng.randrange(len(kept)))
        return " ".join(kept or words[:1])
    if kind == 1:
        length = max(1, len(words) // 2)
        start = rng.randrange(len(words) - length + 1) if words else 0
        return " ".join(words[start : start + length])
    return " ".join(words[: max(1, len(words) // 2)] + others[len(others) // 2 :])


def unlabeled_texts(tokenizer: Tokenizer, texts: list[str], copies: int, max_characters: int, seed: int,
                    corpus: Sequence[str] = ()) -> TokenSplit:
    """``copies`` perturbed copies of ``texts`` followed by the ``corpus`` sentences as they are, tokenised (labels 0:
    only the teacher's output is used)."""
    rng = random.Random(seed)
    out = [perturb_text(text, texts[rng.randrange(len(texts))], rng) for _ in range(copies) for text in texts]
    return encode(tokenizer, out + list(corpus), max_characters)


def load_package_descriptions(status: Path = DPKG_STATUS) -> list[str]:
    """Sentences of the long descriptions of the Debian packages installed here (``/var/lib/dpkg/status``),
    de-duplicated in file order: fluent technical English about software, which no evaluation set is drawn from (the
    OOD sets are licences, quotes and Python docstrings). How many depends on the machine's packages (1,580 on the
    development machine)."""
    if not status.is_file():
        raise FileNotFoundError(f"no package database at {status} (a Debian machine has one)")
    seen: dict[str, None] = {}
    for stanza in status.read_text(errors="replace").split("\n\n"):
        lines = stanza.splitlines()
        start = next((i for i, line in enumerate(lines) if line.startswith("Description:")), None)
        if start is None:
            continue
        body = []  # continuation lines start with a space; a lone "." is a paragraph break
        for line in lines[start + 1:]:
            if not line.startswith(" "):
                break
            if line.strip() != ".":
                body.append(line.strip())
        for sentence in sentences(" ".join(body)):
            seen.setdefault(sentence, None)
    return list(seen)


# Unlabeled text corpora by name (``distil.unlabeled_corpus``): none of them is an evaluation set.
UNLABELED_CORPORA: dict[str, Callable[[], list[str]]] = {"debian_descriptions": load_package_descriptions}
