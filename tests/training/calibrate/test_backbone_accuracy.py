"""A calibrated model is never less accurate than its backbone without saying so, on a tiny ViT where DIRECTOR is much
worse: its head fitted well on colour images (100% on validation and test), its kernel distilled for one step at
K = 2 (the identity map from the embeddings, a third right). ``--method director`` publishes it with a warning in the
command's last lines and on the page; ``auto`` serves the post-hoc path; ``--strict`` publishes nothing. The same runs
show what a user reads while it works: the depth search counts the depths it will distil, and the export names each
step. Later runs resume the first one's fit and kernel, so only the export runs again."""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path
from typing import NamedTuple

import pytest

from artifact.contract import MANIFEST, parse_manifest
from tests.training.calibrate.test_calibrate import TINY
from tests.training.calibrate.tiny_checkpoints import save_vit_checkpoint, write_image_folder
from training.cli import main
from training.export.stage import EXPORT_STEPS

NAME = "worse"


class Done(NamedTuple):
    returncode: int
    stdout: str
    stderr: str
    card: str  # the model's card as the run left it


class Runs(NamedTuple):
    tmp: Path
    director: Done
    auto: Done
    strict: Done
    two_depths: Done


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    tmp = tmp_path_factory.mktemp("backbone-accuracy")
    checkpoint = save_vit_checkpoint(tmp / "ckpt", head=False)
    folder = write_image_folder(tmp / "images", per_class=40)

    def calibrate(*extra: str) -> Done:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = main(["calibrate", "--backbone", str(checkpoint), "--data", str(folder), "--name", NAME,
                           "--run-dir", str(tmp / "run"), "--repository", str(tmp / "repo"), *TINY,
                           "--set", "fit.train=all", "--set", "fit.epochs=8", "--set", "fit.lr=0.003",
                           "--set", "distil.max_steps=1", *extra])
        card = tmp / "repo" / NAME / "README.md"
        return Done(status, out.getvalue(), err.getvalue(), card.read_text() if card.is_file() else "")

    one = ("--set", "distil.depth_candidates=[2]")
    return Runs(tmp, calibrate("--method", "director", *one), calibrate("--method", "auto", "--version", "2", *one),
                calibrate("--method", "director", "--strict", "--version", "3", *one),
                calibrate("--method", "director", "--version", "4", "--set", "distil.depth_candidates=[1,2]"))


def manifest(runs: Runs, version: int) -> dict:
    return json.loads((runs.tmp / "repo" / NAME / str(version) / MANIFEST).read_text())


def test_a_version_less_accurate_than_its_backbone_is_published_with_a_warning(runs: Runs) -> None:
    done = runs.director
    assert done.returncode == 0, done.stderr
    verdict = parse_manifest(manifest(runs, 1)).kernel_verdict
    assert verdict is not None and verdict.served == "director"
    losses = {c.set: c for c in verdict.comparisons if c.metric == "accuracy"}
    assert set(losses) == {"validation", "the test split"}
    assert all(c.material_loss and c.posthoc == 1.0 and c.director < 0.7 for c in losses.values())
    lines = done.stdout.rstrip().splitlines()
    warning = next(line for line in lines[-4:] if line.startswith("warning: "))
    assert "this version serves DIRECTOR, which is less accurate than its backbone beyond noise: on validation" in \
        warning and "against 100.00%" in warning and "--strict refuses" in warning
    assert lines[-1].startswith(f"wrote {runs.tmp / 'repo' / NAME / '1'}") and "less accurate than its backbone" in \
        lines[-1]
    page = done.card  # the results page, as the model's card
    assert page.startswith(f"# {NAME} v1: results")
    assert "**Warning: less accurate than its backbone.** This version serves DIRECTOR" in page
    assert "| the test split | accuracy |" in page and "| validation | accuracy |" in page


def test_auto_publishes_the_posthoc_path_instead(runs: Runs) -> None:
    done = runs.auto
    assert done.returncode == 0, done.stderr
    document = manifest(runs, 2)
    assert document["method"] == "posthoc" and document["kernel_verdict"]["served"] == "posthoc"
    loss = re.search(r"worse beyond noise and its margin on accuracy on validation (-\d+\.\d+) points",
                     document["kernel_verdict"]["sentence"])
    assert loss is not None and float(loss.group(1)) < -30  # a kernel far less accurate than its backbone
    assert "warning:" not in done.stdout and "less accurate" not in done.stdout.rstrip().splitlines()[-1]
    assert done.card.startswith(f"# {NAME} v2: results") and "Warning" not in done.card


def test_strict_refuses_to_publish_it(runs: Runs) -> None:
    done = runs.strict
    assert done.returncode == 2 and "Traceback" not in done.stderr
    error = done.stderr.splitlines()[-1]
    assert error.startswith("error: --strict: this version serves DIRECTOR, which is less accurate than its backbone "
                            "beyond noise")
    assert error.endswith(f"nothing was published ({runs.tmp / 'repo' / NAME / '3'} was not written)")
    assert done.card == runs.auto.card  # the model's card is still version 2's
    assert sorted(p.name for p in (runs.tmp / "repo" / NAME).iterdir()) == ["1", "2", "4", "README.md",
                                                                            f"{NAME}-reliability.png"]


def test_the_depth_search_counts_the_depths_it_distils(runs: Runs) -> None:
    """The first run distils its one candidate (K = 2 of a 2-layer ViT: "depth 1 of 1", not "2 of 2"); a rerun with
    K in [1, 2] distils K = 1 alone and says K = 2 was distilled before; a rerun of the same candidates distils none."""
    assert "depth search: K in [2], distilling 1 (K in [2])\ndepth 1 of 1: distilling K=2\n" in runs.director.stdout
    assert "K=2 (the last 2 of 2 transitions diffused)" in runs.director.stdout
    assert "depth search: K in [2], distilling 0; K in [2] distilled before, resumed" in runs.auto.stdout
    assert "depth 1 of" not in runs.auto.stdout
    assert ("depth search: K in [1, 2], distilling 1 (K in [1]); K in [2] distilled before, resumed\n"
            "depth 1 of 1: distilling K=1\n") in runs.two_depths.stdout


def test_the_export_names_each_step_as_it_starts(runs: Runs) -> None:
    lines = runs.director.stdout.splitlines()
    named = [line for line in lines if line.startswith("export ") and "/" in line.split(":")[0]]
    assert named == [f"export {i}/{len(EXPORT_STEPS)}: {step}" for i, step in enumerate(EXPORT_STEPS, start=1)]
    assert "export 4/7: the kernel's verdict" in named
