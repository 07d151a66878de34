from pathlib import Path

import torch
from tokenizers import Tokenizer

from training.config import validated
from training.data.held_out_shift import held_out_shift, rotated, typo, with_typos
from training.data.images import Split
from training.data.tokens import TOKENIZER_FILE, encode, train_wordpiece

TEXTS = ["a quietly moving film about grief and the people who carry it",
         "the plot is thin , the jokes land flat and the ending drags on",
         "ok", "!!"]


def test_typos_edit_about_the_rate_of_words_and_keep_everything_else() -> None:
    texts = TEXTS * 50
    typed = with_typos(texts, seed=3)
    assert with_typos(texts, seed=3) == typed and with_typos(texts, seed=4) != typed  # drawn under the seed
    words = [w for t in texts for w in t.split(" ")]
    typed_words = [w for t in typed for w in t.split(" ")]
    assert len(words) == len(typed_words)  # no word dropped or added, spacing kept
    changed = [(a, b) for a, b in zip(words, typed_words, strict=True) if a != b]
    eligible = sum(sum(c.isalpha() for c in w) >= 2 for w in words)
    assert 0.2 < len(changed) / eligible < 0.4  # TYPO_RATE 0.3, less swaps of equal letters
    for before, after in changed:
        assert abs(len(before) - len(after)) <= 1  # one edit: a swap, a dropped or a doubled letter
    assert "!!" in typed  # no letters, no typo


def test_each_typo_kind_is_one_letter_edit() -> None:
    import random

    seen = {typo("film", random.Random(seed)) for seed in range(60)}
    assert "ifml" not in seen and seen - {"film"}
    assert any(len(w) == 3 for w in seen) and any(len(w) == 5 for w in seen)  # dropped and doubled
    assert any(sorted(w) == sorted("film") and w != "film" for w in seen)  # neighbours swapped


def test_text_shift_is_tokenised_with_the_runs_tokenizer(tmp_path: Path) -> None:
    tokenizer: Tokenizer = train_wordpiece(TEXTS * 5, vocab_size=200)
    tokenizer.no_padding()
    tokenizer.save(str(tmp_path / TOKENIZER_FILE))
    labels = torch.tensor([1, 0, 1, 0])
    val = encode(tokenizer, TEXTS, 1000, labels)
    cfg = validated({"name": "t", "modality": "text", "run_dir": str(tmp_path), "seed": 5})
    shift = held_out_shift(cfg, val)
    assert shift.description == "validation + validation with typos"
    assert shift.split.texts == with_typos(TEXTS, 5)
    assert torch.equal(shift.split.labels, labels)
    assert shift.split.ids.shape[0] == 4


def test_image_shift_rotates_and_keeps_labels() -> None:
    images = torch.rand(6, 1, 8, 8)
    labels = torch.arange(6)
    cfg = validated({"name": "t", "modality": "image", "seed": 2})
    shift = held_out_shift(cfg, Split(images, labels))
    assert shift.description == "validation + rotated validation"
    assert torch.equal(shift.split.images, rotated(Split(images, labels), 2).images)
    assert torch.equal(shift.split.labels, labels) and not torch.equal(shift.split.images, images)


def test_images_on_disk_rotate_into_a_file_like_images_in_memory() -> None:
    """A user's validation images kept on disk (``ImageFile``) rotate into another file, one image at a time, to what
    the in-memory path gives (8-bit storage: within half a level of 1/255)."""
    from training.data.image_file import ImageFile

    images = (torch.rand(6, 3, 10, 12, generator=torch.Generator().manual_seed(0)) * 255).round() / 255
    stored = ImageFile.create(None, 6, (3, 10, 12))
    for i, image in enumerate(images):
        stored.write(i, image)
    labels = torch.arange(6)
    on_disk = rotated(Split(stored, labels), seed=5)
    in_memory = rotated(Split(images, labels), seed=5)
    assert isinstance(on_disk.images, ImageFile) and torch.equal(on_disk.labels, labels)
    torch.testing.assert_close(on_disk.images[torch.arange(6)], in_memory.images, atol=0.5 / 255 + 1e-6, rtol=0)
