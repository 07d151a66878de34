"""The OOD-validation families: distinct kinds of input, shaped as the model reads them, none a reported set."""

from __future__ import annotations

from pathlib import Path

import torch
import yaml

from tests.conftest import tiny_config_dict
from training.config import load_config
from training.data.far_ood_texts import FAR_OOD_KINDS
from training.data.images import Split
from training.data.ood_families import (
    USER_FAMILY,
    image_ood_families,
    pattern_images,
    shuffled_pixel_images,
    smooth_noise_images,
)
from training.data.ood_texts import load_changelog_entries, load_docstring_sentences, load_source_code_lines
from training.data.unlabeled import load_package_descriptions


def test_smooth_noise_spans_zero_to_one_and_is_smooth() -> None:
    images = smooth_noise_images(8, (1, 28, 28), seed=0)
    assert images.shape == (8, 1, 28, 28)
    assert torch.allclose(images.amin(dim=(1, 2, 3)), torch.zeros(8)) and torch.allclose(images.amax(dim=(1, 2, 3)),
                                                                                          torch.ones(8))
    neighbours = (images[..., 1:] - images[..., :-1]).abs().mean()
    assert neighbours < 0.1  # uniform noise's neighbours differ by 1/3 on average


def test_shuffled_pixels_keep_each_images_intensities() -> None:
    images = torch.rand(5, 3, 6, 6, generator=torch.Generator().manual_seed(1))
    shuffled = shuffled_pixel_images(Split(images, torch.zeros(5, dtype=torch.long)), 4, seed=0)
    assert shuffled.shape == (4, 3, 6, 6)
    for original, moved in zip(images[:4], shuffled, strict=True):
        assert torch.equal(original.flatten(1).sort(dim=1).values, moved.flatten(1).sort(dim=1).values)
        assert not torch.equal(original, moved)


def test_image_families_and_the_users_set_with_its_weight(tmp_path: Path) -> None:
    from PIL import Image

    folder = tmp_path / "mine"
    folder.mkdir()
    for i in range(3):
        Image.new("L", (40, 30), color=60 * i).save(folder / f"{i}.png")
    raw = tiny_config_dict(tmp_path)
    raw["export"].update({"ood_validation_images": 10, "ood_validation_data": str(folder),
                          "ood_validation_weight": 2.5})
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    cfg = load_config(path)
    val = Split(torch.rand(12, 1, 28, 28), torch.zeros(12, dtype=torch.long))
    families = image_ood_families(cfg, val, (1, 28, 28))
    assert list(families) == ["photo_patches", "smooth_noise", "shuffled_pixels", "patterns", USER_FAMILY]
    assert all(family.split.images.shape[1:] == (1, 28, 28) for family in families.values())
    assert [len(f.split) for f in families.values()] == [10, 10, 10, 10, 3]
    assert families[USER_FAMILY].weight == 2.5 and families["photo_patches"].weight == 1.0


def test_text_families_share_nothing_with_the_reported_docstrings_or_the_distillation_corpus() -> None:
    docstrings, descriptions = set(load_docstring_sentences()), set(load_package_descriptions())
    code, changes = set(load_source_code_lines()), set(load_changelog_entries())
    assert len(code) > 500 and len(changes) > 100
    assert not docstrings & code and not docstrings & changes
    assert not descriptions & changes and not descriptions & code


def test_patterns_are_seeded_in_range_and_of_four_kinds() -> None:
    images = pattern_images(8, (3, 16, 20), seed=4)  # [8, 3, 16, 20]
    assert images.shape == (8, 3, 16, 20) and float(images.min()) >= 0.0 and float(images.max()) <= 1.0
    assert torch.equal(images, pattern_images(8, (3, 16, 20), seed=4))
    assert torch.equal(images[:, 0], images[:, 2])  # grey: every channel the same
    flat, stripes = images[3, 0], images[0, 0]
    assert bool((flat == flat[0, 0]).all()) and float(stripes.std()) > 0.1
    assert set(images[1, 0].unique().tolist()) == {0.0, 1.0}  # a checkerboard


def test_far_ood_texts_are_seeded_and_of_their_kind() -> None:
    """Each kind gives ``n`` texts, the same under the same seed and others under another; strings of random
    characters, words outside the Latin script, numbers, markup."""
    texts = {name: generate(40, 0) for name, (generate, _) in FAR_OOD_KINDS.items()}
    for name, (generate, description) in FAR_OOD_KINDS.items():
        assert len(texts[name]) == 40 and all(texts[name]) and "OOD validation only" in description
        assert generate(40, 0) == texts[name] and generate(40, 1) != texts[name]
    assert sum(any(ord(c) > 0x036F for c in t) for t in texts["other_scripts"]) == 40
    assert all(sum(c.isdigit() for c in t) > len(t) / 4 for t in texts["numbers_and_tables"])
    assert all(any(mark in t for mark in ("<", "http", "{", "From:")) for t in texts["markup_and_urls"])
