"""Perturbed unlabeled inputs for distillation: seeded, of the right size, and really perturbed."""

from __future__ import annotations

import random

import torch

from training.config import TextConfig
from training.text_inputs import build_tokenizer
from training.unlabeled import perturb_text, perturbed_images, perturbed_texts


def test_perturbed_images_are_seeded_blends_in_range() -> None:
    images = torch.rand(20, 1, 8, 8)
    first, again = perturbed_images(images, 2, seed=3), perturbed_images(images, 2, seed=3)
    assert first.images.shape == (40, 1, 8, 8) and torch.equal(first.images, again.images)
    assert float(first.images.min()) >= 0.0 and float(first.images.max()) <= 1.0
    assert not any(torch.equal(first.images[i], images[i]) for i in range(20))


def test_every_text_perturbation_changes_or_mixes_the_words() -> None:
    rng = random.Random(0)
    text, other = "a b c d e f g h", "u v w x y z"
    seen = {perturb_text(text, other, rng) for _ in range(60)}
    assert any("z" in s for s in seen)  # halves of two sentences joined
    assert any(len(s.split()) == 4 and "z" not in s for s in seen)  # a cropped half
    assert all(s and s != text for s in seen)


def test_perturbed_texts_tokenise_every_copy() -> None:
    texts = ["a good movie , with heart", "dull and far too long", "the cast is wonderful"]
    tokenizer = build_tokenizer(TextConfig(backbone="tiny", tokenizer="wordpiece", vocab_size=60), texts)
    split = perturbed_texts(tokenizer, texts, copies=2, max_characters=100, seed=1)
    assert len(split) == 6 and bool((split.mask.sum(dim=1) >= 1).all())
    assert split.texts == perturbed_texts(tokenizer, texts, copies=2, max_characters=100, seed=1).texts
