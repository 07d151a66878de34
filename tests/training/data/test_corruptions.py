"""Fashion-MNIST-C corruptions: shape, range, determinism, severity ordering on real images, errors."""

from __future__ import annotations

import pytest
import torch

from training.data.corruptions import (
    CORRUPTIONS,
    PARAMETERS,
    SEVERITIES,
    corrupt,
    corruption_seed,
    corruption_subset,
)
from training.data.images import load_fashion_mnist_split

FASHION_ROOT = "/usr/share/datasets/fashion-mnist"
EXPECTED = ("gaussian_noise", "shot_noise", "impulse_noise", "gaussian_blur", "motion_blur", "contrast",
            "elastic_transform", "pixelate", "jpeg_compression")


@pytest.fixture(scope="module")
def images() -> torch.Tensor:
    test = load_fashion_mnist_split(FASHION_ROOT, "test")
    return test.images[corruption_subset(len(test), 12, seed=0)]


def test_names_severities_and_table() -> None:
    assert CORRUPTIONS == EXPECTED and SEVERITIES == (1, 2, 3, 4, 5)
    assert set(PARAMETERS) == set(CORRUPTIONS) and all(len(v) == 5 for v in PARAMETERS.values())


@pytest.mark.parametrize("name", EXPECTED)
def test_corruption_contract_on_real_images(images: torch.Tensor, name: str) -> None:
    distances = []
    for severity in SEVERITIES:
        seed = corruption_seed(name, severity)
        out = corrupt(images, name, severity, seed)
        assert out.shape == images.shape and out.dtype == torch.float32
        assert float(out.min()) >= 0.0 and float(out.max()) <= 1.0
        assert torch.equal(out, corrupt(images.clone(), name, severity, seed)), "not deterministic"
        assert torch.equal(out, corrupt(images, name, severity)), "default seed is corruption_seed(name, severity)"
        distance = float((out - images).abs().mean())
        assert distance > 1e-3, f"{name} severity {severity} barely changes the image"
        distances.append(distance)
    assert all(a <= b for a, b in zip(distances, distances[1:], strict=False)), f"{name}: {distances}"


@pytest.mark.parametrize("name", EXPECTED)
def test_rows_are_independent_of_the_batch_and_seed_matters(images: torch.Tensor, name: str) -> None:
    full = corrupt(images, name, 3, 123)
    assert torch.equal(corrupt(images[:5], name, 3, 123), full[:5])
    if name not in {"gaussian_blur", "contrast", "pixelate", "jpeg_compression"}:  # the random ones
        assert not torch.equal(corrupt(images, name, 3, 124), full)


@pytest.mark.parametrize("shape", [(3, 3, 32, 32), (2, 2, 9, 11), (2, 1, 8, 8)])
def test_any_channels_and_size(shape: tuple[int, int, int, int]) -> None:
    x = torch.rand(shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    for name in CORRUPTIONS:
        out = corrupt(x, name, 5, 0)
        assert out.shape == x.shape and out.dtype == torch.float32
        assert float(out.min()) >= 0.0 and float(out.max()) <= 1.0


def test_known_answers() -> None:
    flat = torch.full((2, 1, 10, 10), 0.3)
    for name in ("gaussian_blur", "motion_blur", "contrast", "elastic_transform", "pixelate"):
        assert torch.allclose(corrupt(flat, name, 5, 0), flat, atol=1e-6), name
    black = torch.zeros(2, 1, 10, 10)
    assert torch.equal(corrupt(black, "shot_noise", 5, 0), black)  # no photons, no shot noise
    x = torch.rand(2, 1, 10, 10, generator=torch.Generator().manual_seed(1))
    mean = x.mean(dim=(-2, -1), keepdim=True)
    assert torch.allclose(corrupt(x, "contrast", 5, 0), (x - mean) * PARAMETERS["contrast"][4] + mean, atol=1e-6)
    assert corrupt(torch.zeros(0, 1, 28, 28), "motion_blur", 2, 0).shape == (0, 1, 28, 28)


def test_invalid_arguments_raise() -> None:
    x = torch.rand(1, 1, 8, 8)
    with pytest.raises(ValueError, match="gaussian_noise.*jpeg_compression"):
        corrupt(x, "fog", 1, 0)
    for severity in (0, 6, True, "3"):
        with pytest.raises(ValueError, match="1, 2, 3, 4, 5"):
            corrupt(x, "contrast", severity, 0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="valid"):
        corruption_seed("snow", 1)
    with pytest.raises(ValueError, match=r"\[N, C, H, W\]"):
        corrupt(x[0], "contrast", 1, 0)
    with pytest.raises(ValueError, match=r"\[N, C, H, W\]"):
        corrupt((x * 255).to(torch.uint8), "contrast", 1, 0)


def test_seeds_are_stable_and_distinct() -> None:
    seeds = {corruption_seed(n, s) for n in CORRUPTIONS for s in SEVERITIES}
    assert len(seeds) == 45 and all(0 <= s < 2**63 for s in seeds)
    assert corruption_seed("gaussian_noise", 1) == 8395233294943399351  # a stable hash, not Python's hash()
    assert corruption_seed("gaussian_noise", 1, base_seed=1) != corruption_seed("gaussian_noise", 1)


def test_subset_is_fixed_sorted_and_unique() -> None:
    subset = corruption_subset(10_000, 2000)
    assert subset.dtype == torch.int64 and subset.shape == (2000,)
    assert torch.equal(subset, corruption_subset(10_000, 2000, seed=0))
    assert torch.equal(subset, subset.unique()) and int(subset.min()) >= 0 and int(subset.max()) < 10_000
    assert not torch.equal(subset, corruption_subset(10_000, 2000, seed=1))
    with pytest.raises(ValueError):
        corruption_subset(10, 11)
