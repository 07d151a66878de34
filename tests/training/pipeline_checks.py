"""Checks both pipelines' tests run (image and text alike): distillation resumes from its checkpoint, and an
exported artifact runs in a clean interpreter that imports none of our packages."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from training.cli import main
from training.config import load_config
from training.runtime import load_checkpoint


def check_distil_resumes(config: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Copy the run (the exported one stays untouched), ask for a third epoch: it resumes at epoch 2 and trains."""
    copy_run = tmp_path / "run"
    shutil.copytree(Path(load_config(config).run_dir), copy_run)
    before = load_checkpoint(copy_run / "director.pt")["kernel"]
    args = ["--config", str(config), "--set", f"run_dir={copy_run}", "--set", "distil.epochs=3"]
    assert main(["distil", *args]) == 0
    assert "resuming distillation at epoch 2" in capsys.readouterr().out
    after = load_checkpoint(copy_run / "director.pt")
    assert len(after["history"]) == 3
    assert any(not torch.equal(before[k], after["kernel"][k]) for k in before)


def check_runs_isolated(script: str, folder: Path) -> None:
    """Run ``script`` with ``python -I`` in ``folder`` (no site or repository on the path); it must print ``ok``."""
    result = subprocess.run([sys.executable, "-I", "-c", script], capture_output=True, text=True, cwd=folder,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("ok")
