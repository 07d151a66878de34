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
from training.export.torch_export import close, compile_package, export_methods, input_bounds
from training.posthoc.writing import script_module


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
    its teacher layer carried, exported from a probe of 6 texts padded to 9 tokens (views of a batch padded to all 16
    positions, as the validation split's rows are); only ``scored_rows`` is compiled
    (the image packages cover the rest; a method costs 15-30 s of compiling), behind the loader's shape check."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    view = BertTransitionView(_tiny_classifier(seed=0))
    torch.manual_seed(0)
    director = text_director_from_view(view, lively_kernel(view.dim, view.num_heads, 1)).eval()
    director.rollout.set_teacher(view.teacher_steps(1))
    artifact = fold_for_artifact(director, "int8", max_positions=16, layer_dtype="float16")
    ids, mask = _padded_batch([5, 9, 3, 7, 2, 8], 100, seed=2)  # [6, 9]
    # the probe as the validation loader gives it: views cut to the longest text from rows padded to the table
    wide = [torch.nn.functional.pad(tensor, (0, 16 - tensor.shape[1])) for tensor in (ids, mask)]  # [6, 16] each
    program = export_methods(artifact, (wide[0][:, :9], wide[1][:, :9]))["scored_rows"]
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


def test_a_text_package_reads_a_mask_cut_from_a_wider_one_as_torchscript_does(
        text_package: tuple[CompiledDirector, torch.jit.ScriptModule]) -> None:
    """Compiled code assumes the strides it was compiled for; the loader hands it contiguous inputs, so a view (here
    a mask and ids cut to the longest text from a batch padded to all positions) gives TorchScript's rows, not
    rows read with the wrong stride."""
    package, served = text_package
    ids, mask = _padded_batch([4, 7, 2], 100, seed=4)  # [3, 7]
    wide = [torch.nn.functional.pad(tensor, (0, 16 - tensor.shape[1])) for tensor in (ids, mask)]  # [3, 16] each
    cut = (wide[0][:, :7], wide[1][:, :7])
    assert not cut[0].is_contiguous() and not cut[1].is_contiguous()
    repeats = torch.tensor([2, 1, 3])
    with torch.inference_mode():
        torch.manual_seed(1)
        rows, scores = package.scored_rows(*cut, repeats)
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


def test_the_package_check_takes_scores_to_their_own_scale_and_rows_to_1e_4() -> None:
    """A relative Mahalanobis near 0 is a difference of distances in the hundreds: rounding moves it by ~1e-3 of its
    own size, which the check accepts; a score off by 1% of its scale, or a logit off by 1e-3, it refuses."""
    want = torch.tensor([[0.04, 253.76, -0.8422], [0.08, 466.57, -0.2722]])  # [B, F] kernel error, mds, rmds
    assert close(want, want + torch.tensor([[0.0, 0.0, 7e-4], [0.0, 0.05, -2e-4]]), scores=True)
    assert not close(want, want + torch.tensor([[0.0, 0.0, 0.0], [0.0, 4.7, 0.0]]), scores=True)
    rows = torch.randn(4, 3)  # [R, C]
    assert close(rows, rows + 5e-5, scores=False) and not close(rows, rows + 1e-3, scores=False)
