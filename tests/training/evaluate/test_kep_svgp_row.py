"""The evaluation's KEP-SVGP row on a tiny config: fine-tuned when missing, evaluated beside DIRECTOR with every
metric and paired intervals against each DIRECTOR row."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from training.cli import main


def test_kep_svgp_row_sits_beside_director(tmp_path: Path) -> None:
    from tests.training.evaluate.test_stage import tiny_evaluation_config

    raw = tiny_evaluation_config(tmp_path)
    raw["fit"]["epochs"] = 1
    raw["data"].update({"train_limit": 384, "test_limit": 150, "val_size": 150})
    raw["evaluate"].update({"ensemble_members": 1, "stages": ["test_and_ood"], "noise_correlation_grid": [],
                            "noise_scale_grid": [1.0], "bootstrap": 10, "served_version": None})  # nothing exported
    raw["kep_svgp"] = {"rank": 4, "rank_multi": 2, "epochs": 1, "batch_size": 64, "warmup_steps": 2,
                       "val_images": 60, "val_samples": 2, "in_evaluation": True}
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(raw))
    for stage in ("fit-backbone", "distil", "evaluate"):
        assert main([stage, "--config", str(config)]) == 0
    results = json.loads((tmp_path / "docs" / "tiny-task.json").read_text())
    row = results["test_and_ood"]["kep_svgp"]
    assert row["n_samples"] == 4 and row["label"] == "KEP-SVGP (S=4, last 1 layer(s))"
    test = row["test"]
    assert 0.0 <= test["accuracy"] <= 1.0 and test["n"] == 150 and test["mean_mutual_information"] > 0.0
    assert (tmp_path / "run" / "baselines" / "kep_svgp" / "kep_svgp.pt").is_file()
    for key in ("director_s1", "director_s4"):
        assert f"{key} - kep_svgp" in results["paired"]
    page = (tmp_path / "docs" / "tiny-task.md").read_text()  # the claim's verdict, written from those intervals
    assert "### The method paper's claim on this task" in page and "DIRECTOR (S=4): accuracy" in page
