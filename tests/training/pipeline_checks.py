"""Checks both pipelines' tests run (image and text alike): distillation resumes from its checkpoint, and an
exported artifact runs in a clean interpreter that imports none of our packages."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from training.cli import main
from training.config import load_config
from training.distil.stage import CHECKPOINT_FILE
from training.loading import DIRECTOR_FILE
from training.runtime import load_checkpoint


def check_distil_resumes(config: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Copy the run (the exported one stays untouched), ask for a third epoch: it resumes at epoch 2 and trains.

    The trained weights always move; ``director.pt`` keeps the best-validated epoch's, which is the third only when
    it validated better, so the kept weights are checked against the checkpoint's record of that epoch."""
    copy_run = tmp_path / "run"
    shutil.copytree(Path(load_config(config).run_dir), copy_run)
    before = load_checkpoint(copy_run / CHECKPOINT_FILE)["parts"]
    args = ["--config", str(config), "--set", f"run_dir={copy_run}", "--set", "distil.epochs=3"]
    assert main(["distil", *args]) == 0
    assert "resuming distillation at epoch 2" in capsys.readouterr().out
    progress = load_checkpoint(copy_run / CHECKPOINT_FILE)
    assert progress["epoch"] == 3 and len(progress["history"]) == 3
    assert any(not torch.equal(before[k], progress["parts"][k]) for k in before)
    kept = load_checkpoint(copy_run / DIRECTOR_FILE)
    assert kept["kept_epoch"] == progress["best"]["epoch"]
    best = progress["best"]["parts"]
    best_kernel = {k.removeprefix("kernel."): v for k, v in best.items() if k.startswith("kernel.")}
    assert best_kernel.keys() == kept["kernel"].keys()
    assert all(torch.equal(best_kernel[k], kept["kernel"][k]) for k in best_kernel)


def check_runs_isolated(script: str, folder: Path) -> None:
    """Run ``script`` with ``python -I`` in ``folder`` (no site or repository on the path); it must print ``ok``."""
    result = subprocess.run([sys.executable, "-I", "-c", script], capture_output=True, text=True, cwd=folder,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("ok")


def check_partial_depth(config: Path, tmp_path: Path) -> tuple[Path, Path]:
    """Distil depth K = 1 (with an EMA, a trained readout, one perturbed unlabeled copy of the training inputs and
    the best-NLL epoch kept) on the exported run's backbone and export it; the manifest records the depth and the
    kept epoch. Returns (run folder, artifact folder)."""
    run = tmp_path / "run"
    shutil.copytree(Path(load_config(config).run_dir), run,
                    ignore=shutil.ignore_patterns("director*.pt", "export_report.json"))
    repo = tmp_path / "repo"
    args = ["--config", str(config), "--set", f"run_dir={run}", "--set", "distil.depth=1", "--set",
            "distil.ema_decay=0.9", "--set", "distil.finetune_readout=true", "--set", "distil.unlabeled_copies=1",
            "--set", "distil.l2_target=teacher", "--set", f"export.repository={repo}",
            "--set", f"export.docs_dir={tmp_path / 'docs'}"]
    assert main(["distil", *args]) == 0
    payload = load_checkpoint(run / "director.pt")
    assert payload["depth"] == 1 and payload["kernel_config"]["depth"] == 1
    assert payload["readout"] is not None
    cfg = load_config(config)
    train = cfg.data.train_limit  # training inputs, each with one perturbed copy
    assert payload["history"][0]["step"] == -(-2 * train // cfg.distil.batch_size)
    best = min(payload["history"], key=lambda record: record["val_nll"])
    assert payload["kept_epoch"] == best["epoch"]
    assert main(["export", *args]) == 0
    folder = repo / cfg.export.name / str(cfg.export.version)
    manifest = json.loads((folder / "manifest.json").read_text())
    sampling = manifest["sampling"]
    assert sampling["depth"] == 1 and "steps" not in sampling  # one name for the depth
    assert sampling["prefix_transitions"] == sampling["backbone_steps"] - 1 >= 1
    assert manifest["provenance"]["distil_kept_epoch"] == payload["kept_epoch"]
    return run, folder
