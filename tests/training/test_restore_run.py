"""A lost image run rebuilt from its committed artifacts gives the same backbone and DIRECTOR as the run that exported
them, refuses to overwrite a run, and refuses an artifact whose kernel is folded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from artifact.contract import ARTIFACT
from tests.conftest import copy_export
from training.cli import main
from training.config import load_config
from training.loading import load_backbone, load_director
from training.posthoc.writing import save_scripted, script_module
from training.restore_run import restore_run


def test_a_restored_run_equals_the_one_that_exported_the_artifacts(tiny_export: tuple[Path, Path],
                                                                    tmp_path: Path) -> None:
    config, folder = copy_export(tiny_export, tmp_path)  # the session's run, copied: this test rewrites its artifact
    assert main(["export-baseline", "--config", str(config), "--method", "deterministic"]) == 0
    baseline = tmp_path / "repo" / "tiny-deterministic" / "1"
    original = load_config(config)
    restored_cfg = load_config(config, {"run_dir": str(tmp_path / "restored")})
    with pytest.raises(ValueError, match="folded for serving"):
        restore_run(restored_cfg, folder, baseline)
    # the artifact as exported before the kernel was folded (fashion-vit 7 and earlier): the kernel's own weights
    director, _ = load_director(original.run_dir)
    save_scripted(script_module(director.eval()), folder / ARTIFACT)
    run = restore_run(restored_cfg, folder, baseline)

    pixels = torch.rand(5, 1, 28, 28)  # [5, 1, 28, 28]
    # the same function to float32 rounding: an artifact's stem has its batch norms folded into its convolutions,
    # the restored backbone has them back as identity norms with the folded shift
    close = {"rtol": 1e-5, "atol": 1e-6}
    with torch.no_grad():
        torch.testing.assert_close(load_backbone(run)(pixels), load_backbone(original.run_dir)(pixels), **close)
        a, payload = load_director(run)
        b, source = load_director(original.run_dir)
        a.rollout.noise_scale.fill_(0.0)
        b.rollout.noise_scale.fill_(0.0)
        torch.testing.assert_close(a(pixels, 1), b(pixels, 1), **close)
    assert payload["tau"] == source["tau"] and payload["kept_epoch"] == source["kept_epoch"]
    assert payload["history"] == source["history"] and payload["depth"] == source["depth"]
    # re-exported as a new version: the manifest and the results page say how it was made
    assert main(["export", "--config", str(config), "--set", f"run_dir={run}", "--set", "export.version=2"]) == 0
    manifest = json.loads((tmp_path / "repo" / "tiny" / "2" / "manifest.json").read_text())
    assert manifest["provenance"]["restored_from"] == {"director": str(folder), "backbone": str(baseline)}
    page = (tmp_path / "docs" / "tiny.md").read_text()
    assert "python -m training.restore_run --config" in page and "python -m training export --config" in page
    with pytest.raises(FileExistsError, match="already holds a run"):
        restore_run(restored_cfg, folder, baseline)
    with pytest.raises(ValueError, match="not a deterministic image artifact"):
        restore_run(load_config(config, {"run_dir": str(tmp_path / "other")}), folder, folder)
