"""The kernel-depth stage on a tiny run: the run's own K = 1 against a K = 2 kernel distilled for it, each K's kernel
error alone and with a feature score against that feature score alone, choices on OOD validation only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from models.uncertainty import KERNEL_ERROR, summarize
from training.cli import main
from training.config import PipelineConfig
from training.evaluate.kernel_depth import cost, depth_report, depth_variant, winner
from training.posthoc.ood_selection import ScoreInputs

SETS = ["uniform_noise", "sklearn_digits", "letters"]


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    from tests.conftest import tiny_config_dict

    tmp = tmp_path_factory.mktemp("kernel-depth")
    raw = tiny_config_dict(tmp)
    raw["distil"].update(epochs=1, depth=1)
    raw["backbone"]["drop_rate"] = 0.1  # MC dropout, one of the compared methods, needs dropout layers
    raw["evaluate"] = {"task": "tiny-depth", "stages": ["test_and_ood", "kernel_depth"], "ensemble_members": 1,
                       "samples": 2, "sweep_samples": [1, 2], "noise_scale_grid": [1.0], "noise_correlation_grid": [],
                       "ood_images": 40,
                       "kernel_error_depths": [2, 5], "kernel_depth_epochs": 1, "bootstrap": 20}
    config = tmp / "tiny.yaml"
    config.write_text(yaml.safe_dump(raw))
    for stage in ("fit-backbone", "distil", "evaluate"):
        assert main([stage, "--config", str(config)]) == 0
    return tmp, json.loads((tmp / "docs" / "tiny-depth.json").read_text())


def test_each_depth_is_reported_on_every_set(evaluated: tuple[Path, dict[str, Any]]) -> None:
    tmp, results = evaluated
    kd = results["kernel_depth"]
    assert kd["transitions"] == 2 and kd["served_depth"] == 1
    assert list(kd["depths"]) == ["1", "2"]
    assert kd["skipped"] == {"5": "the backbone has 2 transitions"}
    assert (tmp / "run" / "ablations" / "depth_2-e1" / "director.pt").is_file()
    one, two = kd["depths"]["1"], kd["depths"]["2"]
    assert one["epochs"] == 1 and two["epochs"] == 1
    assert two["cost"] == {"teacher_layers": 2, "extra_kernel_steps": 1, "layer_equivalents_s1": 5,
                           "ratio_to_backbone": 2.5}
    assert one["feature_score"] == two["feature_score"]  # the feature scores do not depend on K
    assert all(one["ood"][s]["feature"] == two["ood"][s]["feature"] for s in SETS)
    for entry in (one, two):
        assert entry["combined_score"].startswith(f"combined ({KERNEL_ERROR} w=")
        assert set(entry["ood"]) == set(SETS)
        for row in entry["ood"].values():
            for key in ("kernel_error", "feature", "combined"):
                assert 0.0 <= row[key]["auroc"] <= 1.0 and 0.0 <= row[key]["fpr95"] <= 1.0
            low, high = row["combined_minus_feature"]["ci95"]
            assert low <= high
    # the K = 1 kernel error is the served model's own: the test_and_ood table reports the same AUROC
    served_row = results["test_and_ood"]["director_s1"]["ood"]["letters"][KERNEL_ERROR]
    assert one["ood"]["letters"]["kernel_error"]["auroc"] == pytest.approx(served_row["auroc"])
    assert kd["winner"]["label"] in kd["winner"]["variants"]
    assert kd["served_score"] == results["test_and_ood"]["director_s1"]["ood_score"]


def test_the_page_shows_the_section_and_its_plot(evaluated: tuple[Path, dict[str, Any]]) -> None:
    tmp, results = evaluated
    page = (tmp / "docs" / "tiny-depth.md").read_text()
    assert f"is `{results['kernel_depth']['served_score']}` (AUROC " in page  # served beside the winner
    assert "### DIRECTOR's own contribution: the kernel error over K steps" in page
    assert "| kernel error | 2 | 1 | 2 / 1 |" in page
    assert "K = 5 is skipped: the backbone has 2 transitions." in page
    assert (tmp / "docs" / "tiny-depth-kernel-depth.png").stat().st_size > 1000


def synthetic(n: int, shift: dict[str, float], seed: int) -> ScoreInputs:
    """Random logits and per-input scores, each score shifted up by ``shift[name]`` (an OOD set's signal)."""
    gen = torch.Generator().manual_seed(seed)
    summary = summarize(torch.randn(1, n, 3, generator=gen))
    names = (KERNEL_ERROR, "mds", "rmds", "knn", "vim")
    inputs = {name: torch.rand(n, generator=gen) + 1.0 + shift.get(name, 0.0) for name in names}  # positive [N]
    return ScoreInputs(summary, inputs)


def test_the_feature_score_and_combination_are_chosen_on_ood_validation_only() -> None:
    # on OOD validation knn separates a little and the kernel error a little; on the reported set rmds alone does
    scores = {"val": synthetic(400, {}, 0), "ood_val": synthetic(400, {"knn": 0.3, KERNEL_ERROR: 0.3}, 1),
              "test": synthetic(400, {}, 2), "far": synthetic(400, {"rmds": 1.0}, 3)}
    report = depth_report(scores, {"ood_val": 1.0}, ["far"], n_boot=50, seed=0)
    assert report["feature_score"] == "knn"  # not rmds, which only the reported set rewards
    assert report["combined_score"].startswith(f"combined ({KERNEL_ERROR} w=") and "+ knn)" in report["combined_score"]
    assert report["validation_auroc"]["combined"] > report["validation_auroc"]["feature"]
    row = report["ood"]["far"]
    assert row["feature"]["auroc"] == pytest.approx(0.5, abs=0.1)  # knn carries nothing on this set
    diff = row["combined_minus_feature"]
    assert diff["difference"] == pytest.approx(row["combined"]["auroc"] - row["feature"]["auroc"])
    assert diff["ci95"][0] <= diff["difference"] <= diff["ci95"][1]


def test_the_winner_prefers_the_simpler_variant_on_a_tie() -> None:
    def entry(kernel: float, combined: float) -> dict[str, Any]:
        return {"feature_score": "mds", "combined_score": "combined (kernel_error w=0.5 + mds)",
                "validation_auroc": {"feature": 0.9, "kernel_error": kernel, "combined": combined}}

    tie = winner({"1": entry(0.8, 0.9), "2": entry(0.9, 0.9)}, "mds", 1)
    assert tie["label"] == "mds" and not tie["differs_from_served"]
    deeper = winner({"1": entry(0.8, 0.92), "3": entry(0.85, 0.95)}, "combined (kernel_error w=0.5 + mds)", 1)
    assert deeper["label"] == "combined (kernel_error w=0.5 + mds) K=3" and deeper["differs_from_served"]
    same = winner({"1": entry(0.8, 0.92)}, "combined (kernel_error w=0.5 + mds)", 1)
    assert same["label"] == "combined (kernel_error w=0.5 + mds) K=1" and not same["differs_from_served"]


def test_cost_counts_the_teacher_layers_and_the_extra_kernel_steps() -> None:
    assert cost(1, 4) == {"teacher_layers": 1, "extra_kernel_steps": 0, "layer_equivalents_s1": 5,
                          "ratio_to_backbone": 1.25}
    assert cost(3, 4)["layer_equivalents_s1"] == 9  # prefix 1 + 3 sampled steps + 3 teacher layers + 2 forced steps


def test_a_depth_variant_trains_its_own_budget_in_its_own_folder(tmp_path: Path) -> None:
    from tests.conftest import tiny_config_dict
    from training.config import load_config

    path = tmp_path / "tiny.yaml"
    raw = tiny_config_dict(tmp_path)
    raw["evaluate"] = {"kernel_depth_epochs": 3, "ablation_epochs": 1}
    path.write_text(yaml.safe_dump(raw))
    cfg: PipelineConfig = load_config(path)
    run = tmp_path / "run"
    run.mkdir()
    torch.save({"tau": 0.1}, run / "director.pt")  # the main run's selected tau, which depth_K selects again
    variant = depth_variant(cfg, 2)
    assert variant.distil.depth == 2 and variant.distil.epochs == 3 and variant.distil.tau is None
    assert variant.run_dir == str(run / "ablations" / "depth_2-e3")
    assert variant.evaluate == cfg.evaluate
