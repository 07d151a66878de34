"""The depth search probes every candidate and distils only the best to the end, on a tiny BERT: each K is distilled
one epoch of two, the one with the best validation NLL goes on, and what it goes on to is exactly the run a search
that distilled only that K would have made (nothing trained twice, nothing changed by the probe). The teacher's
step statistics are gathered once for the run and read by every depth."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.training.calibrate.test_calibrate import TINY, Done
from tests.training.calibrate.tiny_checkpoints import save_text_checkpoint, texts, write_csv
from training.cli import main
from training.runtime import load_checkpoint

EPOCHS = ["--set", "distil.epochs=2", "--set", "distil.batch_size=16"]
ROOT = Path(__file__).resolve().parents[3]


def calibrate(tmp: Path, name: str, checkpoint: Path, data: Path, capsys: pytest.CaptureFixture, *extra: str) -> Done:
    status = main(["calibrate", "--backbone", str(checkpoint), "--data", str(data), "--name", name, "--run-dir",
                   str(tmp / name), "--repository", str(tmp / "repo"), "--method", "director", *TINY, *EPOCHS,
                   *extra])
    out = capsys.readouterr()
    return Done(status, out.out, out.err)


def test_the_best_probe_goes_on_to_the_run_it_would_have_been(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    checkpoint = save_text_checkpoint(tmp_path / "ckpt", "bert")
    data = write_csv(tmp_path / "reviews.csv", texts(120, 4))
    done = calibrate(tmp_path, "probe", checkpoint, data, capsys, "--set", "distil.depth_candidates=[1,2]")
    assert done.returncode == 0, done.stderr
    assert ("depth search: K in [1, 2], each distilled 1 of 2 epochs (a probe), then the best to the end; probing 2 "
            "(K in [1, 2])\ndepth 1 of 2: probing K=1 (1 of 2 epochs)\n") in done.stdout, done.stdout
    assert "depth 2 of 2: probing K=2 (1 of 2 epochs)" in done.stdout
    run = tmp_path / "probe"
    selection = json.loads((run / "depth_selection.json").read_text())
    chosen, other = selection["chosen"], 3 - selection["chosen"]
    probed = selection["probe_validation_nll"]
    assert set(probed) == {"1", "2"} and round(probed[str(chosen)], 4) <= round(probed[str(other)], 4)
    assert list(selection["validation_nll"]) == [str(chosen)] and selection["probe_epochs"] == 1
    assert f"chosen depth K={chosen} (the best validation NLL after the probe): distilling it to 2 epochs" in \
        done.stdout
    kept = load_checkpoint(run / f"depth-{chosen}" / "director.pt")
    assert kept["epochs_trained"] == 2 and kept["finished"]
    assert load_checkpoint(run / f"depth-{other}" / "director.pt")["epochs_trained"] == 1
    assert (run / "teacher_statistics.pt").is_file()  # gathered once: each depth's folder links to it
    assert all((run / f"depth-{k}" / "teacher_statistics.pt").resolve() == (run / "teacher_statistics.pt").resolve()
               for k in (1, 2))

    alone = calibrate(tmp_path, "alone", checkpoint, data, capsys, "--set", f"distil.depth_candidates=[{chosen}]",
                      "--version", "2")
    assert alone.returncode == 0, alone.stderr
    assert "probing" not in alone.stdout and f"depth 1 of 1: distilling K={chosen}" in alone.stdout
    straight = load_checkpoint(tmp_path / "alone" / f"depth-{chosen}" / "director.pt")
    assert [r["val_nll"] for r in straight["history"]] == [r["val_nll"] for r in kept["history"]]
    for key, value in straight["kernel"].items():
        assert torch.equal(value, kept["kernel"][key]), key

    again = calibrate(tmp_path, "probe", checkpoint, data, capsys, "--set", "distil.depth_candidates=[1,2]",
                      "--version", "3")
    assert again.returncode == 0, again.stderr
    assert "probing 0; K in [1, 2] distilled before, resumed" in again.stdout and "depth 1 of" not in again.stdout
    assert "distilling it to" not in again.stdout and f"chosen depth K={chosen}" in again.stdout


def test_the_run_prints_its_estimates_beside_what_it_measured(tmp_path: Path) -> None:
    """The plan's time and peak memory against what the run measured, printed before the last line and kept in
    estimates.json. Memory within 30%; time within a factor of two here (a tiny run's seconds are mostly loading and
    scripting, and move with the load of the machine the suite shares)."""
    checkpoint = save_text_checkpoint(tmp_path / "ckpt", "bert", head=False)
    data = write_csv(tmp_path / "reviews.csv", texts(120, 5))
    # its own process: the peak resident memory it measures is the run's, not the test session's highest so far
    done = subprocess.run([sys.executable, "-m", "training", "calibrate", "--backbone", str(checkpoint), "--data",
                           str(data), "--name", "estimates", "--run-dir", str(tmp_path / "estimates"), "--repository",
                           str(tmp_path / "repo"), "--method", "director", *TINY, *EPOCHS, "--set",
                           "distil.depth_candidates=[1]"], capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.rstrip().splitlines()
    assert lines[-2].startswith("estimated / measured: time ") and "fit-backbone" in lines[-2], lines[-2]
    assert "peak memory" in lines[-2] and "time (estimate)   about " in done.stdout
    record = json.loads((tmp_path / "estimates" / "estimates.json").read_text())
    estimated, measured = record["estimated"], record["measured"]
    assert set(measured["seconds"]) == {"fit", "distil", "export", "total"}
    assert 0.7 <= measured["peak_memory_bytes"] / estimated["peak_memory_bytes"] <= 1.3, record
    assert 0.5 <= measured["seconds"]["total"] / estimated["seconds"]["total"] <= 2.0, record
