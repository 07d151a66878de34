"""The evaluation command end to end on a tiny config: baselines, shift, OOD, sweep, costs, ablations, the page."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from training.cli import main


def tiny_evaluation_config(tmp: Path) -> dict[str, Any]:
    from tests.conftest import tiny_config_dict

    raw = tiny_config_dict(tmp)
    raw["distil"]["epochs"] = 1
    raw["backbone"]["drop_rate"] = 0.1  # MC dropout needs dropout layers
    raw["evaluate"] = {
        "task": "tiny-task", "ensemble_members": 2, "samples": 4, "sweep_samples": [1, 2, 8],
        "noise_scale_grid": [0.5, 1.0], "noise_correlation_grid": [0.0, 1.0],
        "shift_noise_scale_grid": [1.0, 2.0], "noise_fit_images": 40,
        "corruption_images": 40, "corruptions": ["gaussian_noise", "pixelate"],
        "severities": [1, 5], "ood_images": 40, "ablations": ["both", "floor", "l2_only", "tau_0.1"],
        "ablation_epochs": 1, "distil_seeds": [1], "latency_images": 3, "latency_repeats": 1, "bootstrap": 20,
        "served_version": 1,  # exported by the fixture with a fitted noise shape and default S
    }
    # exported as a baseline (fine-tuned on the way) by test_exported_baselines_load_in_the_server
    raw["kep_svgp"] = {"rank": 4, "rank_multi": 2, "epochs": 1, "batch_size": 64, "warmup_steps": 2,
                       "val_images": 60, "val_samples": 2}
    return raw


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("evaluate")
    config = tmp / "tiny.yaml"
    config.write_text(yaml.safe_dump(tiny_evaluation_config(tmp)))
    assert main(["fit-backbone", "--config", str(config)]) == 0
    assert main(["distil", "--config", str(config)]) == 0
    assert main(["export", "--config", str(config), "--set", "export.noise_correlation_grid=[0.0, 1.0]",
                 "--set", "export.default_samples=null", "--set", "export.default_samples_reference=4"]) == 0
    assert main(["evaluate", "--config", str(config)]) == 0
    results = json.loads((tmp / "docs" / "tiny-task.json").read_text())
    return config, results


METHODS = ["deterministic", "temperature_scaling", "mc_dropout", "ensemble", "posthoc", "hybrid", "director_s1",
           "director_s4",
           "director_s4_ts", "director_s4_noise", "director_s4_shift_noise", "director_served"]


def test_the_exported_version_is_evaluated_as_it_serves(evaluated: tuple[Path, dict[str, Any]]) -> None:
    config, results = evaluated
    manifest = json.loads((config.parent / "repo" / "tiny" / "1" / "manifest.json").read_text())
    served, sampling = results["served"], manifest["sampling"]
    rule = manifest["ood"]["thresholds"][str(sampling["default_samples"])]
    assert {k: v for k, v in served.items() if k != "ood"} == {
        "version": 1, "method": "director", "token_correlation": sampling.get("token_correlation", 0.0),
        "noise_scale": sampling["noise_scale"], "default_samples": sampling["default_samples"],
        "temperature": manifest["temperature"]}
    assert served["ood"]["score"] == rule["score"] and served["ood"]["threshold"] == rule["threshold"]
    row = results["test_and_ood"]["director_served"]
    assert row["n_samples"] == sampling["default_samples"] and row["temperature"] == manifest["temperature"]
    # scored by the manifest's own OOD rule and threshold, not a choice made again
    assert row["ood_score"] == manifest["ood"]["selection_choice"] and row["flag_threshold"] == rule["threshold"]
    assert all(row["ood_score"] in per_set for per_set in row["ood"].values())
    assert "1" in results["shift"]["director_served"]["paired_vs_temperature_scaling"]
    assert "samples the run's kernel as version 1 does" in (config.parent / "docs" / "tiny-task.md").read_text()


def test_the_posthoc_path_is_a_row_and_the_kernel_is_ablated_against_it(evaluated: tuple[Path, dict[str, Any]]
                                                                       ) -> None:
    config, results = evaluated
    rows = results["test_and_ood"]
    posthoc = rows["posthoc"]
    # the backbone's own logits under the export's temperature rule: the deterministic row's accuracy, no spread
    assert posthoc["n_samples"] == 1 and posthoc["test"]["accuracy"] == rows["deterministic"]["test"]["accuracy"]
    assert posthoc["test"]["mean_mutual_information"] == 0.0
    assert posthoc["temperature"] == results["posthoc_fit"]["temperature"] > 0
    # its candidates are the feature scores beside the logit scores, never the kernel error
    assert "mds" in posthoc["ood_selection_auroc"] and "kernel_error" not in posthoc["ood_selection_auroc"]
    assert "kernel_error" in rows["director_s1"]["ood_selection_auroc"]
    # every score is chosen over the export's OOD-validation families, not one set
    assert "blurred Gaussian noise" in results["ood_validation_set"]
    assert all(row["ood_selection_regret"] >= 0.0 for row in rows.values())
    ablation = results["kernel_ablation"]
    assert ablation["posthoc"]["label"] == posthoc["label"] and set(ablation["rows"]) == {"director_s1",
                                                                                           "director_served"}
    for key, row in ablation["rows"].items():
        assert row["test"] == results["paired"][f"{key} - posthoc"]
        assert set(row["shift"]) == {"1", "5"} and set(row["ood"]) == {"uniform_noise", "sklearn_digits", "letters"}
        for d in row["ood"].values():
            assert d["auroc"]["difference"] == pytest.approx(d["auroc"]["director"] - d["auroc"]["posthoc"])
            assert d["fpr95"]["ci95"][0] <= d["fpr95"]["ci95"][1]
    page = (config.parent / "docs" / "tiny-task.md").read_text()
    assert "## What the kernel adds: DIRECTOR minus the post-hoc path, paired" in page
    assert page.count("better than the post-hoc path beyond noise on") == 2


@pytest.mark.parametrize(("kind", "label"), [("posthoc", "Post-hoc path"), ("hybrid", "Hybrid")])
def test_a_posthoc_or_hybrid_version_is_served_from_its_own_source(kind: str, label: str) -> None:
    from training.evaluate.evaluation import served_method

    method = served_method({"version": 3, "method": kind, "token_correlation": 0.0, "noise_scale": 1.0,
                            "default_samples": 1, "temperature": 1.2,
                            "temperature_by_score": {"slope": 0.1, "terms": [{"score": "mds", "weight": 1.0,
                                                                              "center": 3.0, "scale": 0.5,
                                                                              "log": True}]}})
    assert (method.key, method.source, method.family, method.n_samples) == (f"{kind}_served", kind, kind, 1)
    assert method.by_score is not None and method.by_score.slope == 0.1
    assert method.label == f"{label} as served (v3, T=1.20 x exp(0.1 * score))"


def test_every_method_gets_every_metric(evaluated: tuple[Path, dict[str, Any]]) -> None:
    _, results = evaluated
    assert list(results["test_and_ood"]) == METHODS
    for key, row in results["test_and_ood"].items():
        test = row["test"]
        for metric in ("accuracy", "nll", "brier", "ece", "adaptive_ece", "mce", "aurc", "misclassification_auroc"):
            assert isinstance(test[metric], float), (key, metric)
        assert 0.0 <= test["accuracy"] <= 1.0 and test["n"] == 300
        low, high = test["ece_ci95"]
        assert low <= high
        assert set(row["ood"]) == {"uniform_noise", "sklearn_digits", "letters"}
        assert row["ood_score"] in row["ood_selection_auroc"]
        for per_score in row["ood"].values():
            for name, m in per_score.items():
                if name != "mean_mutual_information":
                    assert set(m) == {"auroc", "aupr_in", "aupr_out", "fpr95"}
    # mutual information is undefined at S = 1 and mean log-variance exists only for DIRECTOR
    assert "mutual_information" not in results["test_and_ood"]["deterministic"]["ood"]["letters"]
    for native in ("mean_logvar", "kernel_error"):  # DIRECTOR's own scores, reported but never chosen
        assert native in results["test_and_ood"]["director_s4"]["ood"]["letters"]
        assert native in results["test_and_ood"]["director_s4"]["ood_selection_auroc"]
        assert native not in results["test_and_ood"]["mc_dropout"]["ood"]["letters"]
        assert results["test_and_ood"]["director_s4"]["ood_score"] != native
    # the S=1 deterministic rows are identical, so MI is exactly zero; DIRECTOR at S=4 samples really vary
    assert results["test_and_ood"]["deterministic"]["test"]["mean_mutual_information"] == 0.0
    assert results["test_and_ood"]["director_s4"]["test"]["mean_mutual_information"] > 0.0
    assert results["test_and_ood"]["temperature_scaling"]["temperature"] > 0
    assert results["noise_scale"] in (0.5, 1.0)
    # the shift-fitted noise: one grid point per (correlation, scale), chosen on validation and rotated validation
    shift_noise = results["shift_noise"]
    grid = shift_noise["grid"]
    assert set(grid) == {f"rho={r:g} scale={s:g}" for r in (0, 1) for s in (1, 2)}
    chosen = grid[f"rho={shift_noise['token_correlation']:g} scale={shift_noise['noise_scale']:g}"]
    assert chosen["clean_minus_best"] <= 2 * chosen["stderr"] + 1e-6  # within noise of the best clean NLL
    eligible = [p for p in grid.values() if p["clean_minus_best"] <= 2 * p["stderr"] + 1e-6]
    assert chosen["shifted_nll"] == min(p["shifted_nll"] for p in eligible)
    assert shift_noise["fitted_on"] == "validation + rotated validation"


def test_shift_sweep_cost_and_ablations(evaluated: tuple[Path, dict[str, Any]]) -> None:
    _, results = evaluated
    shift = results["shift"]["director_s4"]
    assert set(shift["by_type"]) == {"gaussian_noise", "pixelate"}
    paired = shift["paired_vs_temperature_scaling"]  # DIRECTOR rows only, per severity, pooled over the types
    assert set(paired) == {"1", "5"} and "paired_vs_temperature_scaling" not in results["shift"]["mc_dropout"]
    low, high = paired["5"]["ece"]["ci95"]
    assert low <= high and set(paired["5"]) == {"accuracy", "ece", "nll"}
    assert set(shift["by_severity"]) == {"1", "5"}
    for method, per_method in results["shift"].items():  # each method's own OOD flag on the shifted inputs
        entry = per_method["by_type"]["pixelate"]["5"]
        assert 0.0 <= entry["flag_rate"] <= 1.0, method
        assert (entry["accuracy_flagged"] is None) == (entry["flag_rate"] == 0.0)
        assert (entry["accuracy_kept"] is None) == (entry["flag_rate"] == 1.0)
        kept, flagged = entry["accuracy_kept"] or 0.0, entry["accuracy_flagged"] or 0.0
        assert entry["accuracy"] == pytest.approx((1 - entry["flag_rate"]) * kept + entry["flag_rate"] * flagged)
        assert 0.0 <= results["test_and_ood"][method]["test_flag_rate"] <= 1.0
    assert set(results["sweep"]) == {"director", "mc_dropout"}
    assert set(results["load_average_1m"]) == {"test_and_ood", "detectors", "shift", "decisions", "sweep", "cost",
                                               "ablations", "variance", "kernel_depth"}
    # the whole-stack run (K = T = 2) measures its own K; the default K = 3 is deeper than the backbone
    assert list(results["kernel_depth"]["depths"]) == ["2"] and set(results["kernel_depth"]["skipped"]) == {"3"}
    assert set(results["sweep"]["director"]) == {"1", "2", "8"}
    cost = results["cost"]
    assert cost["deterministic"]["latency_ms_ratio"] == 1.0
    assert cost["ensemble"]["parameters_ratio"] == pytest.approx(2.0)
    assert cost["director_s4"]["peak_memory_bytes"] > 0
    ab = results["ablations"]
    assert set(ab["ablation"]) == {"both", "floor", "l2_only", "tau_0.1"}
    assert ab["ablation"]["floor"]["observed_variance"] == "floor" and ab["ablation"]["floor"]["tau"] == 0.0
    assert ab["ablation"]["tau_0.1"]["tau"] == 0.1
    assert set(ab["seed"]) == {"seed0", "seed1"}
    assert ab["seed"]["seed0"]["accuracy"] != ab["seed"]["seed1"]["accuracy"] or \
        ab["seed"]["seed0"]["nll"] != ab["seed"]["seed1"]["nll"]
    assert ab["seed_mean_std"]["accuracy"]["std"] >= 0.0
    for entry in [*ab["ablation"].values(), *ab["seed"].values()]:  # each served score's AUROC on each OOD set
        assert all(0.0 <= entry[f"auroc_{score}_{name}"] <= 1.0 for score in ("mi", "max_softmax", "energy")
                   for name in ("uniform_noise", "sklearn_digits", "letters"))


def test_free_detectors_on_every_method_against_the_served_score(evaluated: tuple[Path, dict[str, Any]]) -> None:
    """MDS, RMDS, KNN, ViM, GEN and MaxLogit on the features and logits of every method that has them, per OOD set,
    each with its paired AUROC difference from the served version's score; DIRECTOR's own candidates include the
    feature scores its artifact would serve."""
    config, results = evaluated
    detectors = results["detectors"]
    sets = {"uniform_noise", "sklearn_digits", "letters"}
    assert set(detectors["served_score_auroc"]) == sets
    assert detectors["served_method"] == "director_served"  # the exported version's own score, as it serves
    served = results["test_and_ood"]["director_served"]
    for name, report in detectors["served_score_auroc"].items():
        assert report["auroc"] == pytest.approx(served["ood"][name][served["ood_score"]]["auroc"])
    assert set(detectors["methods"]) == {"deterministic", "mc_dropout", "ensemble", "director"}
    assert detectors["methods"]["director"]["rows_per_input"] == 4
    assert detectors["methods"]["ensemble"]["rows_per_input"] == 2
    for entry in detectors["methods"].values():
        assert set(entry["ood"]) == sets
        for per_set in entry["ood"].values():
            assert set(per_set) == {"mds", "rmds", "knn", "vim", "mds_pp", "gen", "max_logit"}
            for report in per_set.values():
                assert 0.0 <= report["auroc"] <= 1.0 and 0.0 <= report["fpr95"] <= 1.0
                low, high = report["served_minus_detector"]["ci95"]
                assert -1.0 <= low <= high <= 1.0
    # the backbone's MDS is one of DIRECTOR's candidates (the artifact carries its statistics)
    assert {"mds", "rmds", "knn", "vim"} <= set(results["test_and_ood"]["director_s1"]["ood_selection_auroc"])
    page = (config.parent / "docs" / "tiny-task.md").read_text()
    assert "### The free detectors, on each method's own features" in page and "Served minus the backbone" in page


def test_predicted_variance_is_set_beside_the_kernels_own_error(evaluated: tuple[Path, dict[str, Any]]) -> None:
    config, results = evaluated
    variance = results["variance"]
    assert set(variance) == {"test", "uniform_noise", "sklearn_digits", "letters"}
    for name, entry in variance.items():
        assert entry["mean_error"] > 0 and entry["mean_variance"] > 0 and -1.0 <= entry["spearman"] <= 1.0
        assert ("auroc_error" in entry) == (name != "test")
    page = (config.parent / "docs" / "tiny-task.md").read_text()
    assert "### Does DIRECTOR's predicted variance follow its own error?" in page and "| letters |" in page


def test_flags_and_risk_coverage_are_on_the_page(evaluated: tuple[Path, dict[str, Any]]) -> None:
    config, _ = evaluated
    docs = config.parent / "docs"
    page = (docs / "tiny-task.md").read_text()
    assert "### Flags by severity" in page and "flagged / acc kept / acc flagged" in page
    assert "![risk-coverage](tiny-task-risk-coverage.png)" in page
    assert (docs / "tiny-task-risk-coverage.png").stat().st_size > 0


def test_prediction_sets_and_abstentions_are_measured(evaluated: tuple[Path, dict[str, Any]]) -> None:
    """Calibrated on the export's calibration split; coverage and size on the test split, each severity and each OOD
    set; the abstentions at every max_risk; the page's section and plot."""
    config, results = evaluated
    section = results["decisions"]
    assert set(section["methods"]) == {"temperature_scaling", "posthoc", "hybrid", "director_s4", "director_served"}
    assert section["calibration_inputs"] > 0 and section["default_score"] == "lac"
    for entry in section["methods"].values():
        test = entry["test"]["sets"]["aps"]
        sizes = [test[c]["mean_size"] for c in ("0.8", "0.9", "0.95", "0.99")]
        assert sizes == sorted(sizes) and sizes[0] >= 0.0 and sizes[-1] <= 10.0
        assert all(0.0 <= test[c]["coverage"] <= 1.0 for c in test)
        assert set(entry["shift"]) == {"1", "5"} and all(level["n"] == 80 for level in entry["shift"].values())
        assert set(entry["ood"]) == {"uniform_noise", "sklearn_digits", "letters"}
        assert "coverage" not in entry["ood"]["letters"]["aps"]["0.9"]  # no labels: sizes only
        assert entry["variant"]["gamma"] in (0.0, 0.25, 0.5, 1.0, 2.0)
        for figures in entry["test"]["selective"].values():
            assert figures["threshold"] is None or 0.0 < figures["threshold"] <= 1.0
    docs = config.parent / "docs"
    page = (docs / "tiny-task.md").read_text()
    assert "## Prediction sets and abstentions" in page and "### Abstentions: Learn then Test" in page
    assert (docs / "tiny-task-decisions.png").stat().st_size > 1000


def test_page_and_plots_are_written(evaluated: tuple[Path, dict[str, Any]]) -> None:
    config, _ = evaluated
    docs = config.parent / "docs"
    page = (docs / "tiny-task.md").read_text()
    assert f"python -m training evaluate --config {config}" in page
    for png in ("tiny-task-reliability.png", "tiny-task-shift.png", "tiny-task-ece-latency.png"):
        assert (docs / png).stat().st_size > 1000
        assert png in page
    assert "DIRECTOR (S=4)" in page and "Deep ensemble (M=2)" in page
    assert "| energy AUROC letters |" in page  # the ablation table's served-score columns


def test_rerun_reads_the_cache(evaluated: tuple[Path, dict[str, Any]]) -> None:
    """A second run trains nothing and samples nothing: every cached file is untouched, the numbers agree."""
    config, first = evaluated
    cache = config.parent / "run" / "eval" / "logits"
    before = {p.name: p.stat().st_mtime_ns for p in cache.iterdir()}
    assert main(["evaluate", "--config", str(config)]) == 0
    after = {p.name: p.stat().st_mtime_ns for p in cache.iterdir()}
    assert after == before
    second = json.loads((config.parent / "docs" / "tiny-task.json").read_text())
    for key in METHODS:
        assert second["test_and_ood"][key]["test"]["nll"] == first["test_and_ood"][key]["test"]["nll"]
    assert second["shift"] == first["shift"]
    fits = json.loads((config.parent / "run" / "eval" / "noise_scale_fits.json").read_text())
    assert len(fits) == 1  # the noise-temperature fit was read back, not redone under another key
    assert second["noise_scale"] == first["noise_scale"] == next(iter(fits.values()))["scale"]
    posthoc = json.loads((config.parent / "run" / "eval" / "posthoc_fits.json").read_text())
    assert len(posthoc) == 1  # the post-hoc path's fit too: read back, the same rule
    assert second["posthoc_fit"] == first["posthoc_fit"]
    assert second["test_and_ood"]["posthoc"]["label"] == first["test_and_ood"]["posthoc"]["label"]


@pytest.mark.parametrize("method", ["deterministic", "mc_dropout", "ensemble", "kep_svgp"])
def test_exported_baselines_load_in_the_server(evaluated: tuple[Path, dict[str, Any]], tmp_path: Path,
                                               method: str) -> None:
    """A baseline artifact passes the server's own validation, sha256 check and warm-up forward."""
    from service.engine.artifact import load_artifact
    from service.engine.device import resolve_device

    config, _ = evaluated
    assert main(["export-baseline", "--config", str(config), "--method", method,
                 "--repository", str(tmp_path)]) == 0
    folder = tmp_path / f"tiny-{method.replace('_', '-')}" / "1"
    artifact = load_artifact(folder, resolve_device("cpu", False, 1))
    manifest = artifact.manifest.document()
    assert manifest["method"] == method and manifest["modality"] == "image"
    sampling = manifest["sampling"]
    expected = {"deterministic": (1, 1), "mc_dropout": (4, 8), "ensemble": (2, 2), "kep_svgp": (4, 8)}[method]
    assert (sampling["default_samples"], sampling["max_samples"]) == expected
    assert set(manifest["ood"]["thresholds"]) == {str(s) for s in (1, 2, 4) if s <= expected[1]}
    rows = artifact.module.sample_rows(torch.rand(2, 1, 28, 28), torch.tensor([1, expected[0]]))
    assert rows.shape == (1 + expected[0], 10)


def test_a_partial_run_marks_the_missing_stages_pending(evaluated: tuple[Path, dict[str, Any]]) -> None:
    """Stages can be run a few at a time (long evaluations span sessions); the page says what is missing."""
    config, _ = evaluated
    assert main(["evaluate", "--config", str(config), "--set", "evaluate.stages=[test_and_ood, sweep]",
                 "--set", "evaluate.task=partial"]) == 0
    docs = config.parent / "docs"
    results = json.loads((docs / "partial.json").read_text())
    assert "sweep" in results and all(stage not in results for stage in ("detectors", "shift", "decisions", "cost",
                                                                  "ablations", "kernel_depth"))
    page = (docs / "partial.md").read_text()
    assert page.count("Not run: this stage is not in this run") == 7  # costs are marked beside the main table
    assert "--set 'evaluate.stages=[test_and_ood, sweep]'" in page
