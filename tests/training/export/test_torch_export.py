"""The torch.export artifact's random numbers (``training.export.torch_export``): with the noise on, the
AOTInductor package of a tiny image DIRECTOR draws exactly what its TorchScript file draws under one seed,
reproducibly and anew on every call, and, seeds apart, rows of the same distribution (per logit: means within 5
standard errors, standard deviations within 15%, over 2,000 rows of each of 3 inputs). One package is compiled (about
35 s on one thread, compiler included)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.service.test_exported_artifact import loaded, write_version


@pytest.fixture(scope="module")
def versions(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    folder = tmp_path_factory.mktemp("exported") / "noise_on" / "1"
    write_version(folder, 1.0)
    yield {"on": folder}
    torch.set_num_threads(threads)


def test_with_the_noise_on_it_draws_torchscripts_numbers_reproducibly_and_anew(versions: dict[str, Path]) -> None:
    artifact, served = loaded(versions["on"])
    pixels, counts = torch.rand(4, 1, 28, 28), torch.tensor([3, 1, 2, 4])
    draws = []
    with torch.inference_mode():
        for module in (artifact.module, served, artifact.module):
            torch.manual_seed(7)
            draws.append(module.sample_rows(pixels, counts))
        again = artifact.module.sample_rows(pixels, counts)
    torch.testing.assert_close(draws[0], draws[1], rtol=0.0, atol=1e-5)  # the same draws as TorchScript
    assert torch.equal(draws[0], draws[2])  # reproducible under the seed
    assert not torch.allclose(draws[2], again)  # a new draw on the next call
    assert (draws[0][:3] - draws[0][:1]).abs().max() > 1e-3  # one input's samples differ


def test_with_the_noise_on_independent_draws_have_torchscripts_distribution(versions: dict[str, Path]) -> None:
    artifact, served = loaded(versions["on"])
    pixels, counts = torch.rand(3, 1, 28, 28), torch.tensor([2000, 2000, 2000])
    with torch.inference_mode():
        torch.manual_seed(1)
        ours = artifact.module.sample_rows(pixels, counts).view(3, 2000, -1)  # [3, 2000, 10]
        torch.manual_seed(2)
        theirs = served.sample_rows(pixels, counts).view(3, 2000, -1)
    spread = theirs.std(dim=1)  # [3, 10]
    assert bool((spread > 1e-3).all())  # the noise reaches the logits
    stderr = (ours.var(dim=1) / 2000 + theirs.var(dim=1) / 2000).sqrt()  # [3, 10]
    assert bool(((ours.mean(dim=1) - theirs.mean(dim=1)).abs() < 5 * stderr).all())
    assert bool(((ours.std(dim=1) / spread - 1).abs() < 0.15).all())
