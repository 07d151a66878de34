"""Stage 3: export ``director.ts`` + ``manifest.json`` into the model repository and record the evaluation the
manifest needs (docs/architecture.md).

The steps: calibrate the sampling on validation (noise temperature, default sample count), build and verify the
TorchScript artifact, decide the served temperature, measure the served statistics (reference distributions, OOD
score and thresholds), measure the test split, write the manifest and the results page. ``ExportParts``
(``training.export.parts``) is what a modality contributes.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from artifact.contract import (
    ARTIFACT,
    FORMAT_VERSION,
    Manifest,
    Provenance,
    Sampling,
    TemperatureByScore,
    Variance,
    file_digests,
    parse_manifest,
)
from models.uncertainty import ScoreTemperature, Temperature, summarize, temperature_for
from training.config import PipelineConfig
from training.data.held_out_shift import HeldOutShift, held_out_shift
from training.evaluate.rollout_diagnostics import mean_logvar_score, split_rollout_trace
from training.export.calibration import fit_temperature
from training.export.final_artifact import finish_artifact
from training.export.model_page import write_results
from training.export.ood_selection import ScoreInputs
from training.export.parts import ExportParts, artifact_info, export_parts
from training.export.plots import reliability_diagram
from training.export.served_statistics import (
    ServedStatistics,
    choose_default_samples,
    fit_noise_scale,
    fit_noise_shape,
    fit_temperature_slope,
    reference_section,
    sample_split,
    served_statistics,
    served_temperature,
    temperature_on_shift,
    temperature_terms,
)
from training.export.writing import git_commit, install_version, source_record, staging_dir, write_manifest
from training.loading import AnySplit, Director, load_backbone, load_director, run_family
from training.metrics import classification_report, ece_bootstrap
from training.ood_metrics import auroc
from training.runtime import set_threads


@dataclass
class SamplingChoice:
    """How the artifact samples, chosen on validation."""

    noise_scale: float
    noise_scale_nll: dict[str, float]
    default_samples: int
    default_samples_nll: dict[str, dict[str, float]]
    token_correlation: float = 0.0
    noise_shape_fit: dict[str, Any] | None = None  # every grid point's NLLs and what they were measured on
    shift: HeldOutShift | None = None  # the held-out shift the noise was shaped on, if it was


def fit_sampling_noise(director: Director, val: AnySplit, cfg: PipelineConfig, n_samples: int,
                       shift: HeldOutShift | None) -> tuple[float, dict[str, float], float, dict[str, Any] | None]:
    """The noise temperature alone (``fit_noise_scale``, on validation NLL) when the token correlation is one fixed
    value (0: the kernel's diagonal Gaussian), else both together on validation and its held-out ``shift``
    (``fit_noise_shape``): (noise scale, its NLL by scale, token correlation, the shape fit's record)."""
    ecfg, seed = cfg.export, cfg.seed
    if shift is None:
        rho = (ecfg.noise_correlation_grid or [0.0])[0]
        director.rollout.set_token_correlation(rho)
        scale, nll = fit_noise_scale(director, val, ecfg.noise_scale_grid, n_samples, seed)
        return scale, nll, rho, None
    rho, scale, points = fit_noise_shape(director, val, shift.split, ecfg.noise_correlation_grid,
                                         ecfg.noise_scale_grid, n_samples, seed)
    return scale, {}, rho, {"grid": points, "fitted_on": shift.description}


def calibrate_sampling(director: Director, parts: ExportParts, cfg: PipelineConfig) -> SamplingChoice:
    """The noise temperature (fitted at the reference sample count) and the default S: ``export.default_samples``,
    or (null) the smallest S whose validation NLL is within noise of the reference's, and, when the noise was shaped
    on a held-out shift (more than one token correlation to choose from), its NLL on that shift too."""
    ecfg, seed = cfg.export, cfg.seed
    val = parts.data.val.head(ecfg.threshold_images)
    reference = ecfg.default_samples or ecfg.default_samples_reference
    shift = held_out_shift(cfg, val) if len(ecfg.noise_correlation_grid) > 1 else None
    noise_scale, noise_nll, rho, shape_fit = fit_sampling_noise(director, val, cfg, reference, shift)
    if ecfg.default_samples is not None:
        return SamplingChoice(noise_scale, noise_nll, ecfg.default_samples, {}, rho, shape_fit, shift)
    default_s, table, shifted_table = choose_default_samples(director, val, ecfg.sample_counts, reference, seed,
                                                             None if shift is None else shift.split)
    if shape_fit is not None:
        shape_fit["default_samples_nll_shifted"] = shifted_table
    return SamplingChoice(noise_scale, noise_nll, default_s, table, rho, shape_fit, shift)


def temperature_draws(served: torch.nn.Module, parts: ExportParts, cfg: PipelineConfig, default_s: int
                      ) -> torch.Tensor | None:
    """The validation draws [S, N, C] at the default S that the served temperature and its slope are fitted on (a
    seed of their own), or None when neither is fitted."""
    ecfg = cfg.export
    if not ecfg.temperature_scaling and not any(ecfg.temperature_slope_grid):
        return None
    return sample_split(served, parts.data.val, default_s, cfg.seed + 2)  # [S, N, C]


def choose_temperature(served: torch.nn.Module, parts: ExportParts, cfg: PipelineConfig, default_s: int,
                       shift: HeldOutShift | None, clean: torch.Tensor | None) -> tuple[float, dict[str, float]]:
    """The served temperature on the sampled logits ``clean`` (``temperature_draws``): kept when it wins on held-out
    validation (else 1), and, when the noise was shaped on the held-out ``shift``, when it does not undo that there
    (``temperature_on_shift``)."""
    ecfg, seed = cfg.export, cfg.seed
    if not ecfg.temperature_scaling or clean is None:
        return 1.0, {}
    val = parts.data.val
    temperature, record = served_temperature(clean, val.labels)
    if shift is None or temperature == 1.0:
        return temperature, record
    shifted = sample_split(served, shift.split, default_s, seed + 2)  # [S, N', C]
    kept, on_shift = temperature_on_shift(temperature, clean, val.labels, shifted, shift.split.labels)
    return kept, {**record, **on_shift, "temperature_clean": temperature}


@dataclass
class ScoreTemperatureFit:
    temperature: ScoreTemperature | None  # None: the fit kept one temperature (slope 0)
    record: dict[str, Any]  # the slope, the terms, what it was fitted on, every slope's figures


def choose_temperature_by_score(served: torch.nn.Module, parts: ExportParts, cfg: PipelineConfig, default_s: int,
                                temperature: float, stats: ServedStatistics, clean: torch.Tensor | None
                                ) -> ScoreTemperatureFit | None:
    """A temperature per input that grows with the served OOD score, when ``export.temperature_slope_grid`` offers
    slopes: fitted on validation and its held-out shift (``fit_temperature_slope``), served when its slope is above 0
    (the reference distributions are then measured again under it). None when no slope is offered; not fitted when
    the served score reads the logits (``temperature_terms``)."""
    ecfg, seed, val = cfg.export, cfg.seed, parts.data.val
    if not any(ecfg.temperature_slope_grid) or clean is None:
        return None
    val_scores = stats.input_scores("val", val)
    terms = temperature_terms(stats.choice, default_s, val_scores or {})
    if val_scores is None or not terms:
        return ScoreTemperatureFit(None, {"slope": 0.0, "not_fitted": "the served OOD score reads the logits, which "
                                          "the temperature divides (or the model returns no per-input scores)"})
    shift = held_out_shift(cfg, val)
    shifted = sample_split(served, shift.split, default_s, seed + 2)  # [S, N', C]
    shift_scores = stats.input_scores("held_out_shift", shift.split)
    assert shift_scores is not None  # the served module returned val's
    slope, table = fit_temperature_slope(temperature, terms, sorted({0.0, *ecfg.temperature_slope_grid}), clean,
                                         val.labels, val_scores, shifted, shift.split.labels, shift_scores)
    record = {"slope": slope, "terms": [dataclasses.asdict(term) for term in terms],
              "fitted_on": shift.description, "fit": table}
    if slope == 0.0:
        return ScoreTemperatureFit(None, record)
    by_score = ScoreTemperature(temperature, slope, terms)
    reference = reference_section(summarize(stats.val_logits, by_score(val_scores)), val.labels, default_s)
    stats.reference = {**reference, "ood_rate": stats.reference["ood_rate"]}  # the OOD score reads no logits
    return ScoreTemperatureFit(by_score, record)


def test_block(probs: torch.Tensor, labels: torch.Tensor) -> dict[str, Any]:
    """Test-split metrics of probabilities [N, C] with a bootstrap interval of the ECE."""
    _, low, high = ece_bootstrap(probs, labels)
    report = classification_report(probs, labels)
    return {**report, "ece_ci95": [low, high], "ece_half_width": (high - low) / 2, "n": int(labels.shape[0])}


@dataclass
class TestFigures:
    metrics: dict[str, Any]
    probabilities: dict[str, torch.Tensor]  # method label -> test probabilities [N, C] (the reliability plot)
    backbone_temperature: float


def test_figures(served: torch.nn.Module, director: Director, parts: ExportParts, backbone_parameters: int,
                 stats: ServedStatistics, default_s: int, temperature: Temperature, seed: int) -> TestFigures:
    """Backbone, temperature-scaled backbone and the served DIRECTOR on the test split and the reported OOD sets."""
    data, test = parts.data, parts.data.test
    labels = test.labels
    backbone_test = parts.backbone_logits(test)  # [N, C]
    backbone_t = fit_temperature(parts.backbone_logits(data.val), data.val.labels)
    choice, errors = stats.choice, stats.input_scores
    test_temperature = temperature_for(temperature, errors("test", test))  # one, or [N] by score
    test_summary = summarize(sample_split(served, test, default_s, seed), test_temperature)
    s1_summary = summarize(sample_split(served, test, 1, seed), test_temperature)
    rule, threshold = choice.rule_at(default_s), stats.ood["thresholds"][str(default_s)]["threshold"]
    test_inputs = ScoreInputs(test_summary, errors("test", test))
    test_logvar = mean_logvar_score(director, test, seed)
    ood_metrics: dict[str, Any] = {}
    for name, split in parts.reported_ood.items():
        scores = errors(name, split)
        logits = sample_split(served, split, default_s, seed)  # [S, N, C]
        inputs = ScoreInputs(summarize(logits, temperature_for(temperature, scores)), scores)
        ood_metrics[name] = {
            "mean_mutual_information": float(inputs.summary.mutual_information.mean()),
            "auroc_vs_test": {label: auroc(test_inputs.score(c.name, c.terms), inputs.score(c.name, c.terms))
                              for label, c in choice.reported().items()},
            "flagged_rate": float((inputs.score(rule.name, rule.terms) > threshold).float().mean()),
        }
        ood_metrics[name]["auroc_vs_test"]["mean_logvar"] = auroc(test_logvar, mean_logvar_score(director, split, seed))
    probabilities = {"backbone": backbone_test.softmax(-1),
                     f"backbone + TS (T={backbone_t:.2f})": (backbone_test / backbone_t).softmax(-1),
                     f"DIRECTOR S={default_s}": test_summary.probabilities}
    metrics = {
        "backbone": {**test_block(probabilities["backbone"], labels), "parameters": backbone_parameters},
        "backbone_temperature_scaled": {**test_block((backbone_test / backbone_t).softmax(-1), labels),
                                        "temperature": backbone_t},
        "director_s1": test_block(s1_summary.probabilities, labels),
        # the served S last: at a default of S = 1 this entry is also director_s1
        f"director_s{default_s}": {**test_block(test_summary.probabilities, labels),
                                   "mean_mutual_information": float(test_summary.mutual_information.mean()),
                                   "flagged_rate": float((test_inputs.score(rule.name, rule.terms) > threshold)
                                                         .float().mean())},
        "ood": ood_metrics,
    }
    return TestFigures(metrics, probabilities, backbone_t)


def reproduce_command(cfg: PipelineConfig, payload: dict[str, Any], backbone_payload: dict[str, Any]) -> str:
    """How the export is reproduced: the whole pipeline, or (a run rebuilt by ``training.restore_run`` from committed
    artifacts) the restore and the export."""
    if "restored" not in payload:
        return f"python -m training all --config {cfg.source}"
    return (f"python -m training.restore_run --config {cfg.source} --director {payload['source']} "
            f"--backbone {backbone_payload['source']}\npython -m training export --config {cfg.source}")


@dataclass
class ExportRun:
    """What the export reads from a run: the distilled DIRECTOR and its saved payload, the backbone and its payload,
    and what the run's modality contributes."""

    cfg: PipelineConfig
    director: Director
    payload: dict[str, Any]  # director.pt
    backbone: torch.nn.Module
    backbone_payload: dict[str, Any]  # backbone.pt
    parts: ExportParts

    @property
    def backbone_parameters(self) -> int:
        return sum(p.numel() for p in self.backbone.parameters())


def load_run(cfg: PipelineConfig) -> ExportRun:
    """The run's DIRECTOR, backbone and modality parts, loaded once for every later step."""
    run_dir = Path(cfg.run_dir)
    director, payload = load_director(run_dir)
    backbone = load_backbone(run_dir)
    family, backbone_payload = run_family(run_dir)
    return ExportRun(cfg, director, payload, backbone, backbone_payload, export_parts(cfg, family, backbone))


def stage_artifact(run: ExportRun, tmp_dir: Path) -> tuple[torch.nn.Module, torch.jit.ScriptModule]:
    """The TorchScript artifact (adaLN folded into per-step buffers) with every per-input score, and the modality's
    files, written into the staging folder; returns the eager artifact module and the scripted one (the statistics
    and the OOD score's choice are measured on it)."""
    artifact_module, served = run.parts.build_artifact(run.director, tmp_dir / ARTIFACT)
    for name, source in run.parts.files.items():
        shutil.copyfile(source, tmp_dir / name)
    return artifact_module, served


def provenance(run: ExportRun, sampling: SamplingChoice, temperature_fit: dict[str, Any], figures: TestFigures,
               diagnostics: dict[str, Any], export_seconds: float) -> Provenance:
    """Where the version came from and what it measured: the backbone, data, config, commit, stage times, the test
    figures and how the sampling, the temperature and the distillation went."""
    cfg, ecfg, payload, backbone_payload = run.cfg, run.cfg.export, run.payload, run.backbone_payload
    return Provenance(
        backbone={**run.parts.backbone_description, "parameters": run.backbone_parameters},
        dataset=cfg.data.dataset, config=cfg.source, seed=cfg.seed, git_commit=git_commit(),
        date=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        seconds={"fit_backbone": backbone_payload["seconds"], "distil": payload["seconds"],
                 "export": round(export_seconds, 1)},
        test_metrics=figures.metrics,
        noise_scale_nll=sampling.noise_scale_nll,
        noise_scale_fit_samples=ecfg.default_samples or ecfg.default_samples_reference,
        **({"noise_shape_fit": sampling.noise_shape_fit} if sampling.noise_shape_fit else {}),
        default_samples_nll=sampling.default_samples_nll,
        temperature_fit=temperature_fit,
        rollout=diagnostics,
        step_statistics={k: [float(x) for x in v] for k, v in payload["stats"].items()},
        distil_history=payload["history"],
        distil_kept_epoch=payload["kept_epoch"],
        **({"restored_from": {"director": payload["source"], "backbone": backbone_payload["source"]}}
           if "restored" in payload else {}),
        **({"sources": {"checkpoint": source_record(cfg.pretrained.source),
                        "checkpoint_weights": source_record(cfg.pretrained.checkpoint),
                        "data": source_record(cfg.data.root)}}
           if cfg.pretrained.source is not None else {}),
    )


def director_manifest(run: ExportRun, sampling: SamplingChoice, temperature: float, served_stats: ServedStatistics,
                      artifact_module: torch.nn.Module, provenance: Provenance, tmp_dir: Path,
                      by_score: ScoreTemperatureFit | None = None) -> Manifest:
    """The version's manifest (the depth under ``sampling.depth`` alone; older manifests also carry it as
    ``sampling.steps``, which the contract reads as the depth)."""
    cfg, payload = run.cfg, run.payload
    depth = run.director.rollout.num_steps
    return Manifest(
        format_version=FORMAT_VERSION, name=cfg.export.name, version=str(cfg.export.version), method="director",
        modality=cfg.modality, labels=list(run.parts.data.labels), input=run.parts.input_section,
        sampling=Sampling(depth=depth, backbone_steps=payload["backbone_steps"],
                          prefix_transitions=payload["backbone_steps"] - depth,
                          default_samples=sampling.default_samples, max_samples=cfg.export.max_samples,
                          noise_scale=sampling.noise_scale,
                          **({"token_correlation": sampling.token_correlation} if sampling.token_correlation else {})),
        variance=Variance(observed_variance=payload["observed_variance"], tau=payload["tau"],
                          floors=[float(f) for f in payload["floors"]],
                          tau_selection_accuracy=payload["tau_accuracies"]),
        temperature=temperature, ood=served_stats.ood, reference=served_stats.reference,
        **({"temperature_by_score": TemperatureByScore(**by_score.record)}
           if by_score is not None and by_score.temperature is not None else {}),
        artifact=artifact_info(run.parts, artifact_module), provenance=provenance, files=file_digests(tmp_dir))


def write_reports(run: ExportRun, manifest: Manifest, figures: TestFigures) -> None:
    """The run's export report (the manifest as written), the reliability diagram and the results page, the page
    read from the manifest as the server parses it."""
    cfg, ecfg = run.cfg, run.cfg.export
    document = manifest.document()
    (Path(cfg.run_dir) / "export_report.json").write_text(json.dumps(document, indent=2) + "\n")
    docs_dir = Path(ecfg.docs_dir)
    png = reliability_diagram(figures.probabilities, run.parts.data.test.labels,
                              docs_dir / f"{ecfg.name}-reliability.png")
    write_results(parse_manifest(document), docs_dir, reproduce_command(cfg, run.payload, run.backbone_payload), png)


def export(cfg: PipelineConfig) -> Path:
    """Calibrate the sampling, stage and verify the artifact, measure what the manifest records, then write the
    manifest, swap the version in and write the reports."""
    t_start = time.perf_counter()
    set_threads(cfg.threads)
    ecfg = cfg.export
    run = load_run(cfg)
    progress = tqdm(total=6, desc="export", leave=False)
    sampling = calibrate_sampling(run.director, run.parts, cfg)
    default_s = sampling.default_samples
    progress.update()
    out_dir = Path(ecfg.repository) / ecfg.name / str(ecfg.version)
    tmp_dir = staging_dir(out_dir)
    artifact_module, served = stage_artifact(run, tmp_dir)
    progress.update()
    # the served temperature, reference statistics and the OOD score, from the artifact that will be served
    clean = temperature_draws(served, run.parts, cfg, default_s)
    temperature, temperature_fit = choose_temperature(served, run.parts, cfg, default_s, sampling.shift, clean)
    served_stats = served_statistics(served, run.parts.data, ecfg, ecfg.sample_counts, default_s, cfg.seed,
                                     run.parts.ood_validation, run.parts.selection_set, temperature)
    by_score = choose_temperature_by_score(served, run.parts, cfg, default_s, temperature, served_stats, clean)
    if by_score is not None:  # kept or not, the slope's fit is recorded
        temperature_fit = {**temperature_fit, "by_score": by_score.record}
    progress.update()
    figures = test_figures(served, run.director, run.parts, run.backbone_parameters, served_stats, default_s,
                           by_score.temperature if by_score and by_score.temperature else temperature, cfg.seed)
    diagnostics = split_rollout_trace(run.director, run.parts.data.test.head(500), cfg.seed)
    progress.update()
    record = provenance(run, sampling, temperature_fit, figures, diagnostics, time.perf_counter() - t_start)
    draft = director_manifest(run, sampling, temperature, served_stats, artifact_module, record, tmp_dir, by_score)
    finish_artifact(run.parts, run.cfg.export.format, artifact_module, served, draft.scores_read(), tmp_dir)
    manifest = director_manifest(run, sampling, temperature, served_stats, artifact_module, record, tmp_dir, by_score)
    write_manifest(tmp_dir, manifest)
    install_version(tmp_dir, out_dir)
    progress.update()
    write_reports(run, manifest, figures)
    progress.update()
    progress.close()
    metrics = figures.metrics
    slope = "" if not by_score or not by_score.temperature else f" x exp({by_score.temperature.slope:g} * score)"
    print(f"exported {out_dir} (depth {manifest.sampling.depth}, S={default_s}, T={temperature:.3f}{slope}, OOD score "
          f"{manifest.ood.score}); test: backbone acc {metrics['backbone']['accuracy']:.4f} "
          f"ece {metrics['backbone']['ece']:.4f}, DIRECTOR acc {metrics[f'director_s{default_s}']['accuracy']:.4f} "
          f"ece {metrics[f'director_s{default_s}']['ece']:.4f}")
    return out_dir
