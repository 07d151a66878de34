"""One check both pipelines' tests run: distillation resumes from its checkpoint (image and text alike)."""

from __future__ import annotations

import shutil
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
