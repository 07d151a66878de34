"""The real pipeline end to end on a tiny config: fit-backbone, distil (and resume), export, load."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from artifact.contract import MANIFEST, parse_manifest, sha256_file, verify_files
from tests.conftest import copy_export
from tests.training.pipeline_checks import check_distil_resumes, check_partial_depth, check_runs_isolated
from training.cli import main
from training.config import load_config
from training.loading import load_backbone, load_director
from training.posthoc.writing import load_scripted
from training.runtime import load_checkpoint


@pytest.fixture(scope="module")
def exported(tiny_export: tuple[Path, Path]) -> tuple[Path, Path]:
    """The three stages run once for the session (``tiny_export``, read only here); returns (config path, artifact
    folder)."""
    return tiny_export


def test_stages_write_checkpoints_with_their_config(exported: tuple[Path, Path]) -> None:
    config, _ = exported
    cfg = load_config(config)
    run = Path(cfg.run_dir)
    backbone = load_checkpoint(run / "backbone.pt")
    director = load_checkpoint(run / "director.pt")
    assert backbone["config"]["backbone"]["embed_dim"] == 32
    assert director["config"]["distil"]["lambda_1"] == 0.8
    assert director["tau"] in cfg.distil.tau_grid
    assert len(director["history"]) == cfg.distil.epochs
    for record in director["history"]:
        assert len(record["var_obs"]) == 2 and len(record["var_p"]) == 2 and len(record["mean_sq_error"]) == 2
        assert 0.0 <= record["val_accuracy"] <= 1.0


def test_distil_resumes_from_its_checkpoint(exported: tuple[Path, Path], tmp_path: Path,
                                           capsys: pytest.CaptureFixture) -> None:
    check_distil_resumes(exported[0], tmp_path, capsys)


def test_manifest_follows_the_artifact_contract(exported: tuple[Path, Path]) -> None:
    _, folder = exported
    manifest = json.loads((folder / MANIFEST).read_text())
    assert manifest["format_version"].split(".")[0] == "1"
    assert manifest["modality"] == "image" and manifest["method"] == "director"
    assert len(manifest["labels"]) == 10
    assert manifest["input"]["channels"] == 1 and manifest["input"]["height"] == 28
    assert manifest["sampling"]["default_samples"] == 4 and manifest["sampling"]["max_samples"] == 8
    assert set(manifest["ood"]["thresholds"]) == {"1", "2", "4"}
    assert manifest["ood"]["thresholds"]["1"]["score"] != "mutual_information"
    assert manifest["ood"]["fallback_score"] != "mutual_information"
    ref = manifest["reference"]
    assert ref["n_samples"] == 4 and len(ref["confidence_quantiles"]) == 101
    assert ref["confidence_quantiles"] == sorted(ref["confidence_quantiles"])
    assert manifest["files"]["director.ts"]["sha256"] == sha256_file(folder / "director.ts")
    assert verify_files(folder, parse_manifest(manifest)) == []
    prov = manifest["provenance"]
    assert {"backbone", "dataset", "config", "seed", "git_commit", "date", "test_metrics"} <= set(prov)
    assert len(prov["rollout"]["median_std_over_rms"]) == 2


def test_the_kernel_error_and_feature_scores_compete_for_the_ood_score(exported: tuple[Path, Path]) -> None:
    """The exported file carries the backbone's last transitions and the feature statistics: the kernel error and
    the feature-space scores (with their combinations) were candidates on OOD validation, and the file's
    ``scored_rows`` returns the kernel error and the feature scores the manifest reads (``artifact.input_scores``),
    the others dropped; a chosen combination is standardised on validation with the scores of that very file."""
    from models.uncertainty import FEATURE_SCORES, INPUT_SCORES
    from training.data.calibration_split import carve_calibration
    from training.loading import load_data
    from training.posthoc.ood_selection import COMBINATION_WEIGHTS, LOG_SCALED, combination_label, split_input_scores

    config, folder = exported
    manifest = json.loads((folder / MANIFEST).read_text())
    ood = manifest["ood"]
    assert manifest["artifact"]["scored_rows"].startswith("scored_rows(pixels, repeats")
    read = parse_manifest(manifest).scores_read()
    assert manifest["artifact"]["input_scores"] == ["kernel_error", *(f for f in FEATURE_SCORES if f in read)]
    expected = {*INPUT_SCORES, *(combination_label("kernel_error", w, f) for w in COMBINATION_WEIGHTS
                                 for f in FEATURE_SCORES)}
    assert expected <= set(ood["selection_auroc"])
    assert ood["selection_choice"] in ood["selection_auroc"]
    assert ood["selection_auroc"][ood["selection_choice"]] == max(ood["selection_auroc"].values())
    scripted = load_scripted(folder / "director.ts")
    cfg = load_config(config)
    validation = carve_calibration(load_data(cfg), cfg.export.calibration_share, cfg.seed)[0].val  # as the export's
    scores = split_input_scores(scripted, validation)
    assert scores is not None and list(scores) == manifest["artifact"]["input_scores"]
    assert bool((scores["kernel_error"] > 0).all())
    assert all(bool(torch.isfinite(values).all()) for values in scores.values())
    if ood["score"] == "combined":
        for term in ood["combination"]:
            values = scores[term["score"]].double() if term["score"] in scores else None
            assert term["log"] == (term["score"] in LOG_SCALED)
            if values is not None:
                f = values.log() if term["log"] else values
                assert abs(term["center"] - float(f.mean())) < 1e-3 * max(1.0, abs(float(f.mean())))
    else:
        assert "combination" not in ood


def check_served_equals_eager(run: Path, folder: Path) -> torch.Tensor:
    """The exported file and the eager module of ``run`` give the same draws under one seed; returns them."""
    eager, _ = load_director(run)
    served = load_scripted(folder / "director.ts")
    pixels = torch.rand(3, 1, 28, 28)
    torch.manual_seed(5)
    expected = eager(pixels, 6)
    torch.manual_seed(5)
    got = served(pixels, 6)
    assert got.shape == (6, 3, 10)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    torch.manual_seed(5)
    assert served.sample_rows(pixels, torch.tensor([1, 4, 2])).shape == (7, 10)
    return got


def test_artifact_matches_eager_module_in_distribution(exported: tuple[Path, Path]) -> None:
    config, folder = exported
    check_served_equals_eager(Path(load_config(config).run_dir), folder)


def test_artifact_loads_with_torch_alone(exported: tuple[Path, Path]) -> None:
    _, folder = exported
    script = (
        "import sys, torch\n"
        f"m = torch.jit.load({str(folder / 'director.ts')!r})\n"
        "out = m(torch.rand(2, 1, 28, 28), 3)\n"
        "assert out.shape == (3, 2, 10), out.shape\n"
        "assert not any(name.split('.')[0] in ('models', 'training', 'service', 'timm') for name in sys.modules)\n"
        "print('ok')\n"
    )
    check_runs_isolated(script, folder)


def test_cli_help_lists_the_stages() -> None:
    result = subprocess.run([sys.executable, "-m", "training", "--help"], capture_output=True, text=True,
                            timeout=300)  # imports torch and transformers: slow on a busy machine
    assert result.returncode == 0
    for command in ("fit-backbone", "distil", "export"):
        assert command in result.stdout


def test_results_page_and_plot_are_written(exported: tuple[Path, Path]) -> None:
    config, _ = exported
    docs = Path(load_config(config).export.docs_dir)
    page = (docs / "tiny.md").read_text()
    assert "python -m training all --config" in page
    assert "| DIRECTOR, S=4" in page and "median predicted std / RMS(X_t)" in page
    png = docs / "tiny-reliability.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_one_point_noise_grid_sets_the_buffer(exported: tuple[Path, Path]) -> None:
    """``noise_scale_grid: [0.0]`` must switch the noise off in the module, not only in the manifest."""
    from training.data.images import load_dataset
    from training.posthoc.served_statistics import fit_noise_scale

    config, _ = exported
    cfg = load_config(config)
    director, _ = load_director(cfg.run_dir)
    data = load_dataset(cfg.data.dataset, cfg.data.root, cfg.data.val_size, cfg.data.split_seed,
                        cfg.data.train_limit, cfg.data.test_limit)
    scale, scores = fit_noise_scale(director, data.val.head(8), [0.0], 2, 0)
    assert scale == 0.0 and scores == {}
    assert float(director.rollout.noise_scale) == 0.0
    logits = director(data.val.images[:4], 3)  # [S, B, C]
    assert torch.equal(logits[0], logits[1]) and torch.equal(logits[1], logits[2])


def test_partial_depth_distils_exports_and_matches_eager(exported: tuple[Path, Path], tmp_path: Path) -> None:
    """Depth 1 of 2: the artifact runs the first transition as the real layer inside the TorchScript module and
    still equals the eager module under one seed; the samples differ only through the last step."""
    run, folder = check_partial_depth(exported[0], tmp_path)
    draws = check_served_equals_eager(run, folder)
    assert not torch.allclose(draws[0], draws[1])  # samples differ
    # the readout was trained with the kernel: the post-hoc path (scripted into the run folder) is the backbone's own
    # forward, its own readout included, not the trained one
    pixels = torch.rand(4, 1, 28, 28, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        own = load_backbone(run).eval()(pixels)  # [4, C]
    posthoc = load_scripted(run / "posthoc.ts")
    assert torch.allclose(posthoc.sample_rows(pixels, torch.ones(4, dtype=torch.long)), own, atol=1e-4)


def test_a_token_correlation_grid_is_fitted_recorded_and_scripted(exported: tuple[Path, Path],
                                                                  tmp_path: Path) -> None:
    """Two token correlations: the export fits them with the noise temperature on validation and its rotated copy,
    the manifest records the one chosen, the provenance every grid point, the default S is chosen on validation and
    on that shift, and the TorchScript artifact samples with it (the buffer travels in the file)."""
    config, _ = copy_export(exported, tmp_path)  # the export writes into its run folder too
    repo, docs = tmp_path / "grid-repo", tmp_path / "grid-docs"
    assert main(["export", "--config", str(config), "--set", "export.noise_correlation_grid=[0.0, 1.0]",
                 "--set", "export.default_samples=null", "--set", "export.default_samples_reference=8",
                 "--set", f"export.repository={repo}", "--set", f"export.docs_dir={docs}"]) == 0
    cfg = load_config(config)
    folder = repo / cfg.export.name / str(cfg.export.version)
    manifest = json.loads((folder / "manifest.json").read_text())
    fit = manifest["provenance"]["noise_shape_fit"]
    assert fit["fitted_on"] == "validation + rotated validation"
    assert set(fit["grid"]) == {f"rho={r:g} scale={s:g}" for r in (0, 1) for s in cfg.export.noise_scale_grid}
    rho = manifest["sampling"].get("token_correlation", 0.0)
    chosen = fit["grid"][f"rho={rho:g} scale={manifest['sampling']['noise_scale']:g}"]
    eligible = [p for p in fit["grid"].values() if p["clean_minus_best"] <= 2 * p["stderr"] + 1e-6]
    assert chosen in eligible and chosen["shifted_nll"] == min(p["shifted_nll"] for p in eligible)
    # the default S: within noise of S = 8's NLL on validation and on the shift, both tables recorded
    clean, shifted = manifest["provenance"]["default_samples_nll"], fit["default_samples_nll_shifted"]
    s = manifest["sampling"]["default_samples"]
    assert set(clean) == set(shifted) and str(s) in shifted and "8" in shifted
    for table in (clean, shifted):
        assert table[str(s)]["minus_reference"] <= 2 * table[str(s)]["stderr"] + 1e-6
    # the served temperature, shaped noise: the clean fit or 1, whichever the shift prefers among those within noise
    temperature_fit = manifest["provenance"]["temperature_fit"]
    if "shift_nll_t1" in temperature_fit:
        assert manifest["temperature"] in (temperature_fit["temperature_clean"], 1.0)
    else:  # the clean fit did not win on held-out validation
        assert manifest["temperature"] == 1.0
    artifact = load_scripted(folder / "director.ts")
    assert float(artifact.rollout.token_correlation) == rho
    page = (docs / f"{cfg.export.name}.md").read_text()
    assert "Token correlation of the sampled noise" in page
    assert "on the held-out shift the noise was shaped on is, on each," in page
