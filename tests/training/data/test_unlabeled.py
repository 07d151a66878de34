"""Perturbed unlabeled inputs for distillation: seeded, of the right size, and really perturbed."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from training.config import UNLABELED_CORPUS_NAMES, TextConfig
from training.data.tokens import build_tokenizer
from training.data.unlabeled import (
    UNLABELED_CORPORA,
    load_package_descriptions,
    perturb_text,
    perturbed_images,
    unlabeled_texts,
)


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


def test_unlabeled_texts_tokenise_every_copy() -> None:
    texts = ["a good movie , with heart", "dull and far too long", "the cast is wonderful"]
    tokenizer = build_tokenizer(TextConfig(backbone="tiny", tokenizer="wordpiece", vocab_size=60), texts)
    split = unlabeled_texts(tokenizer, texts, copies=2, max_characters=100, seed=1)
    assert len(split) == 6 and bool((split.mask.sum(dim=1) >= 1).all())
    assert split.texts == unlabeled_texts(tokenizer, texts, copies=2, max_characters=100, seed=1).texts


def test_the_corpus_follows_the_perturbed_copies_unchanged() -> None:
    texts = ["a good movie , with heart", "dull and far too long"]
    corpus = ["the shell reads commands .", "a library for parsing"]
    tokenizer = build_tokenizer(TextConfig(backbone="tiny", tokenizer="wordpiece", vocab_size=60), texts + corpus)
    split = unlabeled_texts(tokenizer, texts, copies=1, max_characters=100, seed=1, corpus=corpus)
    assert len(split) == 4 and split.texts[2:] == corpus
    assert len(unlabeled_texts(tokenizer, texts, copies=0, max_characters=100, seed=1, corpus=corpus)) == 2


STATUS = """Package: dash
Status: install ok installed
Description: POSIX-compliant shell
 The Debian Almquist Shell (dash) is a POSIX-compliant shell derived from ash.
 .
 Since it executes scripts faster than bash, it is the default system shell.
Homepage: http://gondor.apana.org.au/~herbert/dash/

Package: tiny
Description: no long description

Package: gzip
Description: GNU compression utilities
 This package provides the standard GNU file compression utilities, which are
 also the default compression tools for Debian.
 The Debian Almquist Shell (dash) is a POSIX-compliant shell derived from ash.
"""


def test_package_descriptions_are_the_long_descriptions_sentences(tmp_path: Path) -> None:
    status = tmp_path / "status"
    status.write_text(STATUS)
    assert load_package_descriptions(status) == [
        "The Debian Almquist Shell (dash) is a POSIX-compliant shell derived from ash.",
        "Since it executes scripts faster than bash, it is the default system shell.",
        "This package provides the standard GNU file compression utilities, which are also the default compression "
        "tools for Debian.",
    ]  # continuation lines joined, "." breaks and the short description left out, de-duplicated
    with pytest.raises(FileNotFoundError, match="package database"):
        load_package_descriptions(tmp_path / "missing")


def test_every_corpus_the_config_accepts_exists() -> None:
    assert set(UNLABELED_CORPORA) == set(UNLABELED_CORPUS_NAMES)
