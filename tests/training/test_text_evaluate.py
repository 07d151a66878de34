"""The evaluation command on a tiny text config: every baseline over tokenised texts (MC dropout and the ensemble
through packed (ids, mask) rows), fortunes quotes as OOD, the shifted domains, the sweep, costs and the page."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import tiny_text_config_dict
from training.cli import main

METHODS = ["deterministic", "temperature_scaling", "mc_dropout", "ensemble", "kep_svgp", "posthoc", "hybrid",
           "director_s1",
           "director_s4", "director_s4_ts", "director_s4_noise", "director_s4_shift_noise"]


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("text-evaluate")
    raw = tiny_text_config_dict(tmp)
    raw["distil"]["epochs"] = 1
    raw["evaluate"] = {
        "task": "tiny-reviews", "stages": ["test_and_ood", "detectors", "shift", "decisions", "sweep", "cost"],
        "ensemble_members": 2,
        "samples": 4, "sweep_samples": [1, 2, 4], "noise_scale_grid": [0.5, 1.0], "noise_correlation_grid": [0.0, 1.0],
        "shift_noise_scale_grid": [1.0, 2.0], "noise_fit_images": 40, "shift_texts": 50,
        "shifted_domains_as_ood": ["nyt_editorials"],
        "ood_images": 40, "ablations": [], "distil_seeds": [], "latency_images": 3, "latency_repeats": 1,
        "bootstrap": 20,
    }
    # the KEP-SVGP row: fine-tuned by the evaluation from the fitted backbone (attention over real tokens)
    raw["kep_svgp"] = {"rank": 4, "rank_multi": 2, "epochs": 1, "batch_size": 32, "warmup_steps": 2,
                       "val_images": 60, "val_samples": 2, "in_evaluation": True}
    config = tmp / "tiny-text.yaml"
    config.write_text(yaml.safe_dump(raw))
    assert main(["fit-backbone", "--config", str(config)]) == 0
    assert main(["distil", "--config", str(config)]) == 0
    assert main(["evaluate", "--config", str(config)]) == 0
    return config, json.loads((tmp / "docs" / "tiny-reviews.json").read_text())


def test_every_method_is_scored_on_texts(evaluated: tuple[Path, dict[str, Any]]) -> None:
    _, results = evaluated
    assert results["modality"] == "text" and results["unit"] == "texts"
    assert list(results["test_and_ood"]) == METHODS
    for key, row in results["test_and_ood"].items():
        assert row["test"]["n"] == 120, key
        assert 0.0 <= row["test"]["accuracy"] <= 1.0
        # a shifted domain named in evaluate.shifted_domains_as_ood is an OOD set beside the reported ones
        assert set(row["ood"]) == {"fortunes_quotes", "python_docstrings", "shifted_nyt_editorials"}
        assert 0.0 <= row["ood"]["fortunes_quotes"][row["ood_score"]]["auroc"] <= 1.0
    rows = results["test_and_ood"]
    # dropout stays on in MC dropout, so its passes differ; the deterministic rows are identical
    assert rows["mc_dropout"]["test"]["mean_mutual_information"] > 0.0
    assert rows["deterministic"]["test"]["mean_mutual_information"] == 0.0
    assert rows["ensemble"]["test"]["mean_mutual_information"] > 0.0  # two differently seeded members
    assert {"mean_logvar", "kernel_error"} <= set(rows["director_s4"]["ood"]["fortunes_quotes"])
    # the free detectors on texts: the encoders' pooled features (per sample for DIRECTOR and MC dropout)
    detectors = results["detectors"]["methods"]
    assert set(detectors) == {"deterministic", "mc_dropout", "ensemble", "director"}
    for entry in detectors.values():
        for set_name in ("python_docstrings", "shifted_nyt_editorials"):
            report = entry["ood"][set_name]
            assert set(report) == {"mds", "rmds", "knn", "vim", "mds_pp", "gen", "max_logit"}
            assert all(0.0 <= r["auroc"] <= 1.0 for r in report.values())
    assert set(results["detectors"]["served_score_auroc"]) == {"fortunes_quotes", "python_docstrings",
                                                               "shifted_nyt_editorials"}
    families = results["ood_validation_set"]  # every text family, not one set
    assert "licences" in families and "Python standard-library code" in families
    # the post-hoc path on texts: the backbone's logits, its feature scores as candidates, ablated against DIRECTOR
    assert rows["posthoc"]["test"]["accuracy"] == rows["deterministic"]["test"]["accuracy"]
    assert "vim" in rows["posthoc"]["ood_selection_auroc"]
    ablation = results["kernel_ablation"]["rows"]["director_s4"]  # no served version: S = 1 and the default S
    assert set(ablation["shift"]) == {"mean"} and "shifted_nyt_editorials" in ablation["ood"]
    pair = results["paired"]["director_s4 - temperature_scaling"]  # DIRECTOR minus a baseline, same inputs
    for metric in ("accuracy", "ece", "nll"):
        low, high = pair[metric]["ci95"]
        assert low <= high
    assert rows["director_s4"]["test"]["accuracy_ci95"][0] <= rows["director_s4"]["test"]["accuracy"]


def test_kep_svgp_sits_beside_director_on_texts(evaluated: tuple[Path, dict[str, Any]]) -> None:
    config, results = evaluated
    row = results["test_and_ood"]["kep_svgp"]
    assert row["n_samples"] == 4 and row["label"] == "KEP-SVGP (S=4, last 1 layer(s))"
    assert row["test"]["mean_mutual_information"] > 0.0 and "fortunes_quotes" in row["ood"]
    assert "director_s4 - kep_svgp" in results["paired"] and "kep_svgp" in results["shift"]
    assert "### The method paper's claim on this task" in (config.parent / "docs" / "tiny-reviews.md").read_text()


def test_texts_fit_the_noise_shape_on_validation_and_its_typos(evaluated: tuple[Path, dict[str, Any]]) -> None:
    _, results = evaluated
    shift_noise = results["shift_noise"]
    assert shift_noise["fitted_on"] == "validation + validation with typos"
    eligible = [p for p in shift_noise["grid"].values() if p["clean_minus_best"] <= 2 * p["stderr"] + 1e-6]
    chosen = shift_noise["grid"][f"rho={shift_noise['token_correlation']:g} scale={shift_noise['noise_scale']:g}"]
    assert chosen["shifted_nll"] == min(p["shifted_nll"] for p in eligible)  # the typos' NLL chose among them
    assert "director_s4_shift_noise" in results["shift"]
    assert set(results["shift"]["director_s4_shift_noise"]["paired_vs_temperature_scaling"]) == {"mean"}


def test_shift_is_per_domain(evaluated: tuple[Path, dict[str, Any]]) -> None:
    _, results = evaluated
    for result in results["shift"].values():
        assert set(result["by_domain"]) == {"tweets", "nyt_editorials", "amazon_reviews"}
        assert all(entry["n"] == 50 for entry in result["by_domain"].values())
        means = [entry["accuracy"] for entry in result["by_domain"].values()]
        assert result["mean"]["accuracy"] == pytest.approx(sum(means) / 3)
        assert "by_severity" not in result
        assert all(0.0 <= entry["flag_rate"] <= 1.0 for entry in result["by_domain"].values())


def test_prediction_sets_are_measured_per_domain(evaluated: tuple[Path, dict[str, Any]]) -> None:
    _, results = evaluated
    for entry in results["decisions"]["methods"].values():
        assert set(entry["shift"]) == {"tweets", "nyt_editorials", "amazon_reviews"}
        assert all(level["n"] == 50 for level in entry["shift"].values())
        assert set(entry["ood"]) == {"fortunes_quotes", "python_docstrings", "shifted_nyt_editorials"}
        assert 0.0 <= entry["test"]["sets"]["lac"]["0.99"]["mean_size"] <= 2.0  # two labels at most


def test_sweep_and_costs(evaluated: tuple[Path, dict[str, Any]]) -> None:
    _, results = evaluated
    assert set(results["sweep"]["director"]) == {"1", "2", "4"}
    cost = results["cost"]
    assert cost["deterministic"]["latency_ms_ratio"] == 1.0
    assert cost["ensemble"]["parameters_ratio"] == pytest.approx(2.0)
    assert all(cost[k]["peak_memory_bytes"] > 0 for k in ("mc_dropout", "ensemble", "director_s4"))


def test_page_names_the_text_sets(evaluated: tuple[Path, dict[str, Any]]) -> None:
    config, _ = evaluated
    docs = config.parent / "docs"
    page = (docs / "tiny-reviews.md").read_text()
    assert "## Test split (120 texts)" in page
    assert "fortunes_quotes" in page and "python_docstrings" in page and "tweets (n=50)" in page
    assert "DIRECTOR against each baseline, paired" in page
    assert "each domain cut to 50 sentences" in page
    assert "### Flags by domain" in page and "domain nyt_editorials: flagged / acc kept / acc flagged" in page
    assert "## Ablations" in page and "Not run" in page  # not in this config's stages
    for png in ("tiny-reviews-reliability.png", "tiny-reviews-risk-coverage.png", "tiny-reviews-shift.png",
                "tiny-reviews-ece-latency.png"):
        assert (docs / png).stat().st_size > 1000
