"""The torch.export artifact's random numbers (``training.export.torch_export``): with the noise on, the
AOTInductor package of a tiny image DIRECTOR draws exactly what its TorchScript file draws under one seed,
reproducibly and anew on every call, and, seeds apart, rows of the same distribution (per logit: means within 5
standard errors, standard deviations within 15%, over 2,000 rows of each of 3 inputs). A text package (int8 word
table, half-precision layers) does the same at every padded length its position table holds, rows and per-input
scores, and the loader's shape check refuses a longer text as the TorchScript file does. An image package (two
methods: 40-55 s of setup on 2 shared cores, compiler included) and a text one (scored_rows alone, about 20 s) are
compiled."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch._inductor.package import load_package

from artifact.formats import EXPORTED_ARTIFACT
from models.bert_view import BertTransitionView
from models.text_director import fold_for_artifact, text_director_from_view
from service.engine.exported_artifact import CompiledDirector
from tests.models.test_bert_view import _padded_batch, _tiny_classifier
from tests.models.test_kernel_error import lively_kernel
from tests.service.test_exported_artifact import loaded, write_version
from training.export.torch_export import compile_package, export_methods, input_bounds
from training.export.writing import script_module


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


@pytest.fixture(scope="module")
def text_package(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[CompiledDirector, torch.jit.ScriptModule]]:
    """A tiny BERT DIRECTOR as the text export stores it (int8 word table, half-precision layers, 16 positions),
    its teacher layer carried, exported from a probe of 6 texts padded to 9 tokens; only ``scored_rows`` is compiled
    (the image packages cover the rest; a method costs 15-30 s of compiling), behind the loader's shape check."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    view = BertTransitionView(_tiny_classifier(seed=0))
    torch.manual_seed(0)
    director = text_director_from_view(view, lively_kernel(view.dim, view.num_heads, 1)).eval()
    director.rollout.set_teacher(view.teacher_steps(1))
    artifact = fold_for_artifact(director, "int8", max_positions=16, layer_dtype="float16")
    program = export_methods(artifact, _padded_batch([5, 9, 3, 7, 2, 8], 100, seed=2))["scored_rows"]
    path = tmp_path_factory.mktemp("text") / EXPORTED_ARTIFACT
    compile_package({"scored_rows": program}, path)
    scored = load_package(str(path), "scored_rows")
    package = CompiledDirector({"sample_rows": scored, "scored_rows": scored}, input_bounds(program))
    yield package, script_module(artifact)
    torch.set_num_threads(threads)


@pytest.mark.parametrize("lengths", [[1], [3, 4], [16, 2, 11], [2] * 30])
def test_a_text_package_draws_torchscripts_rows_and_scores_at_every_padded_length(
        text_package: tuple[CompiledDirector, torch.jit.ScriptModule], lengths: list[int]) -> None:
    package, served = text_package
    ids, mask = _padded_batch(lengths, 100, seed=3)  # [B, max(lengths)] right-padded
    repeats = torch.arange(1, len(lengths) + 1)  # [B] mixed sample counts
    with torch.inference_mode():
        torch.manual_seed(1)
        rows, scores = package.scored_rows(ids, mask, repeats)
        torch.manual_seed(1)
        want_rows, want_scores = served.scored_rows(ids, mask, repeats)
    torch.testing.assert_close(rows, want_rows, rtol=0.0, atol=1e-5)
    torch.testing.assert_close(scores, want_scores, rtol=1e-4, atol=1e-7)


def test_a_text_longer_than_the_position_table_is_refused_as_torchscript_refuses_it(
        text_package: tuple[CompiledDirector, torch.jit.ScriptModule]) -> None:
    package, served = text_package
    ids, mask = _padded_batch([17], 100, seed=3)
    with pytest.raises(torch.jit.Error, match="longer than the artifact's max_length"):
        served.scored_rows(ids, mask, torch.tensor([1]))
    with pytest.raises(ValueError, match=r"input 0 dimension 1 is 17; the package takes 1\.\.16"):
        package.scored_rows(ids, mask, torch.tensor([1]))
