"""The torch.export artifact (``artifact.format: aoti``): a tiny image DIRECTOR with its teacher transitions, exported
and AOTInductor-compiled (``training.export.torch_export``), against the TorchScript file of the same module. With
the noise off the server's package gives TorchScript's rows and per-input scores at any batch and sample counts
(tests/training/export/test_torch_export.py: the noise on). The server loads the package the manifest names and
refuses, with a reason naming no path, a format it does not know, a package compiled for another device, CPU or torch,
a corrupt one, one the manifest's sha256 list leaves out and, with a digest allowlist, one it does not list. One
package is compiled for the module (two methods: 40-55 s of setup on 2 shared cores, compiler included)."""

from __future__ import annotations

import copy
import json
import logging
import math
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from artifact.contract import (
    ARTIFACT,
    FORMAT_VERSION,
    MANIFEST,
    file_digests,
    parse_manifest,
    read_document,
    sha256_file,
)
from artifact.formats import AOTI_FORMAT, EXPORTED_ARTIFACT
from benchmarks.timing import raw_forward, served_module
from models.backbones import VitConfig, build_vit
from models.director import ImageDirector, StochasticRollout
from models.kernel import TransitionKernel
from models.vit_view import VitTransitionView
from service.engine import trust
from service.engine.artifact import Artifact, ArtifactError, load_artifact
from service.engine.device import Device
from service.engine.exported_artifact import CompiledDirector
from training.export.torch_export import write_compiled
from training.posthoc.writing import save_scripted, script_module

CPU = Device(torch.device("cpu"))


def tiny_director(noise_scale: float) -> ImageDirector:
    """Three ViT layers of width 16, the kernel diffusing the last (K = 1) with a mean map that is not the identity,
    carrying the teacher layer (so ``scored_rows`` returns the kernel error); adaLN folded as an export folds it."""
    torch.manual_seed(0)
    view = VitTransitionView(build_vit(VitConfig(stem_channels=[8, 16], embed_dim=16, depth=3, num_heads=2)).eval())
    kernel = TransitionKernel(16, 2, 1, logvar_init=math.log(0.05))
    with torch.no_grad():
        kernel.adaLN_modulation[-1].weight.normal_(std=0.1)
        kernel.mean_head.weight.normal_(std=0.1)
    rollout = StochasticRollout(kernel, noise_scale, teacher=copy.deepcopy(view.teacher_steps(1)))
    director = ImageDirector(view.embedding, rollout, view.readout_head, view.prefix(2)).eval().requires_grad_(False)
    director.rollout.fold_conditioning()
    return director


def manifest(package: dict, folder: Path) -> dict:
    """A version's manifest serving the package: the kernel error is its OOD score (so forwards call scored_rows)."""
    return {
        "format_version": FORMAT_VERSION, "name": "tiny", "version": folder.name, "modality": "image",
        "labels": [f"class {i}" for i in range(10)],
        "input": {"channels": 1, "height": 28, "width": 28},
        "sampling": {"steps": 1, "default_samples": 4, "max_samples": 8},
        "ood": {"score": "kernel_error", "thresholds": {"1": {"score": "kernel_error", "threshold": 1.0},
                                                        "4": {"score": "kernel_error", "threshold": 1.0}}},
        "artifact": {**package, "input_scores": ["kernel_error"]},
        "files": {name: entry.document() for name, entry in file_digests(folder).items()},
    }


def write_version(folder: Path, noise_scale: float) -> tuple[ImageDirector, torch.jit.ScriptModule]:
    """director.ts, director.pt2 and the manifest of the tiny module in ``folder``."""
    folder.mkdir(parents=True)
    director = tiny_director(noise_scale)
    save_scripted(script_module(director), folder / ARTIFACT)
    served = torch.jit.load(str(folder / ARTIFACT))
    package = write_compiled(director, served, (torch.rand(6, 1, 28, 28),), folder)
    (folder / MANIFEST).write_text(json.dumps(manifest(package, folder)))
    return director, served


@pytest.fixture(scope="module")
def versions(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("exported")
    write_version(root / "noise_off" / "1", 0.0)
    yield {"off": root / "noise_off" / "1"}
    torch.set_num_threads(threads)


def loaded(folder: Path) -> tuple[Artifact, torch.jit.ScriptModule]:
    return load_artifact(folder, CPU), torch.jit.load(str(folder / ARTIFACT))


BATCHES = [(1, [1]), (3, [2, 1, 5]), (17, [1] * 17), (2, [16, 16])]


@pytest.mark.parametrize(("size", "repeats"), BATCHES)
def test_with_the_noise_off_the_package_gives_torchscripts_rows_and_scores(versions: dict[str, Path], size: int,
                                                                           repeats: list[int]) -> None:
    artifact, served = loaded(versions["off"])
    assert artifact.manifest.artifact is not None and artifact.manifest.artifact.format == AOTI_FORMAT
    pixels, counts = torch.rand(size, 1, 28, 28), torch.tensor(repeats)
    with torch.inference_mode():
        rows, scores = artifact.module.scored_rows(pixels, counts)  # [R, 10], [B, 1]
        want_rows, want_scores = served.scored_rows(pixels, counts)
        torch.testing.assert_close(rows, want_rows, rtol=0.0, atol=1e-5)
        torch.testing.assert_close(scores, want_scores, rtol=1e-4, atol=1e-7)
        torch.testing.assert_close(artifact.module.sample_rows(pixels, counts), want_rows, rtol=0.0, atol=1e-5)
        torch.testing.assert_close(artifact.module.forward(pixels, 3), served(pixels, 3), rtol=0.0, atol=1e-5)
    assert torch.equal(rows.argmax(-1), want_rows.argmax(-1))


def test_the_package_refuses_an_input_shape_it_was_not_compiled_for(versions: dict[str, Path]) -> None:
    """Compiled code does not check its inputs; the loader does, from ``artifact.compiled.inputs``."""
    artifact, _ = loaded(versions["off"])
    compiled = json.loads((versions["off"] / MANIFEST).read_text())["artifact"]["compiled"]
    assert compiled["inputs"] == [[[1, None], 1, 28, 28], [[1, None]]]  # inputs dynamic, then repeats
    with pytest.raises(ValueError, match=r"input 0 dimension 2 is 32; the package takes 28\.\.28"):
        artifact.module.sample_rows(torch.rand(2, 1, 32, 32), torch.tensor([1, 1]))
    with pytest.raises(ValueError, match="the package takes 2 inputs, got 1"):
        artifact.module.sample_rows(torch.rand(2, 1, 28, 28))


def copy_version(source: Path, target: Path, edit: dict) -> Path:
    """A copy of the version ``source`` whose manifest's ``artifact`` section is updated by ``edit``."""
    shutil.copytree(source, target)
    document = json.loads((target / MANIFEST).read_text())
    document["artifact"] = {**document["artifact"], **edit}
    (target / MANIFEST).write_text(json.dumps(document))
    return target


def refusal(folder: Path) -> str:
    with pytest.raises(ArtifactError) as caught:
        load_artifact(folder, CPU)
    reason = str(caught.value)
    assert "\n" not in reason and "Traceback" not in reason and str(folder.parent.parent) not in reason
    assert "/tmp" not in reason and "/work" not in reason
    return reason


def test_a_format_the_server_does_not_run_is_refused_with_the_reason(versions: dict[str, Path], tmp_path: Path
                                                                      ) -> None:
    reason = refusal(copy_version(versions["off"], tmp_path / "m" / "1", {"format": "onnx"}))
    assert reason == "artifact.format 'onnx' is not a format this server runs (torchscript, aoti)"


def test_a_package_compiled_for_another_device_cpu_or_torch_is_refused(versions: dict[str, Path], tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    compiled = json.loads((versions["off"] / MANIFEST).read_text())["artifact"]["compiled"]
    cuda = copy_version(versions["off"], tmp_path / "cuda" / "1", {"compiled": {**compiled, "device": "cuda"}})
    assert "compiled for cuda; this server runs on cpu" in refusal(cuda)
    old = copy_version(versions["off"], tmp_path / "old" / "1", {"compiled": {**compiled, "torch": "2.11.0"}})
    assert "compiled by torch 2.11.0" in refusal(old)
    wide = copy_version(versions["off"], tmp_path / "wide" / "1", {"compiled": {**compiled, "cpu_isa": "AVX512"}})
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    assert "needs the CPU instruction set AVX512; this CPU offers AVX2" in refusal(wide)
    bare = copy_version(versions["off"], tmp_path / "bare" / "1", {"compiled": None})
    assert "needs artifact.compiled" in refusal(bare)


def test_a_corrupt_package_or_one_the_manifest_does_not_list_is_refused(versions: dict[str, Path], tmp_path: Path
                                                                        ) -> None:
    unlisted = copy_version(versions["off"], tmp_path / "unlisted" / "1", {})
    document = json.loads((unlisted / MANIFEST).read_text())
    del document["files"][EXPORTED_ARTIFACT]
    (unlisted / MANIFEST).write_text(json.dumps(document))
    assert "files do not list the package 'director.pt2'" in refusal(unlisted)
    corrupt = copy_version(versions["off"], tmp_path / "corrupt" / "1", {})
    (corrupt / EXPORTED_ARTIFACT).write_bytes(b"not a package")
    document = json.loads((corrupt / MANIFEST).read_text())
    document["files"] = {name: entry.document() for name, entry in file_digests(corrupt).items()}
    (corrupt / MANIFEST).write_text(json.dumps(document))
    assert "the AOTInductor package's sample_rows failed to load" in refusal(corrupt)


def test_with_a_digest_allowlist_the_package_must_be_listed_too(versions: dict[str, Path], tmp_path: Path) -> None:
    folder = versions["off"]
    root, scripted, package = folder.parent.parent, folder / ARTIFACT, folder / EXPORTED_ARTIFACT
    allowlist = tmp_path / "trusted.txt"
    allowlist.write_text(f"{sha256_file(scripted)}  {ARTIFACT}\n")
    with pytest.raises(trust.Untrusted, match=r"^director\.pt2 sha256 [0-9a-f]{64} is not in the trusted digests"):
        trust.check(root, folder, allowlist)
    allowlist.write_text(f"{sha256_file(scripted)}\n{sha256_file(package)}\n")
    trust.check(root, folder, allowlist)


def test_the_benchmarks_time_the_module_the_server_runs(versions: dict[str, Path]) -> None:
    """``benchmarks.timing`` loads a package version's package, not the director.ts beside it, and times the call
    the server makes (the version's score reads per-input scores: ``scored_rows``)."""
    folder = versions["off"]
    module = served_module(folder, parse_manifest(read_document(folder)), "cpu")
    assert isinstance(module, CompiledDirector)
    rows = raw_forward(folder, 2, [1, 3], threads=1, min_seconds=0.01)
    timed = [(row["method"], row["batch"], row["rows"]) for row in rows]
    assert timed == [("scored_rows", 1, 2), ("scored_rows", 3, 6)]
    assert all(row["inputs_per_s"] > 0 for row in rows)


def test_loading_a_package_warns_the_operator_that_it_holds_the_interpreter_lock(
        versions: dict[str, Path], caplog: pytest.LogCaptureFixture) -> None:
    """Served on CPU the package answers fewer requests than TorchScript, though its forward is faster: the log says
    why at load, where an operator who chose ``export.format: aoti`` looks."""
    with caplog.at_level(logging.WARNING, logger="service.engine.artifact"):
        load_artifact(versions["off"], CPU)
    warned = [record.getMessage() for record in caplog.records if record.name == "service.engine.artifact"]
    assert len(warned) == 1 and "holds Python's interpreter lock" in warned[0], warned
