"""Stage 3: export ``director.ts`` + ``manifest.json`` into the model repository and record the evaluation the
manifest needs (docs/architecture.md).

The steps: calibrate the sampling on validation (noise temperature, default sample count), build and verify the
TorchScript artifact of DIRECTOR and of the post-hoc path, give each its post-hoc tools (served temperature, OOD score
and thresholds, reference distributions, a temperature per input), compare them paired (the kernel's verdict, which
also decides what ``export.method: auto`` serves), measure the test split (its accuracy joins the verdict:
``training.export.backbone_accuracy``), write the manifest of the served path and the results page. ``ExportParts``
(``training.posthoc.modality_parts``) is what a modality contributes.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from artifact.contract import (
    ARTIFACT,
    FORMAT_VERSION,
    Conformal,
    KernelVerdict,
    Manifest,
    Ood,
    Provenance,
    Sampling,
    TemperatureByScore,
    Variance,
    file_digests,
    parse_manifest,
    scores_read,
)
from training.config import PipelineConfig
from training.data.calibration_split import calibration_description
from training.data.held_out_shift import HeldOutShift, held_out_shift
from training.export.backbone_accuracy import backbone_warning, refuse_unless_as_accurate, with_test_split
from training.export.figures import SplitFigures, test_split_figures
from training.export.final_artifact import finish_artifact
from training.export.model_page import write_results
from training.export.multi_label import export_multi_label
from training.export.plots import reliability_diagram
from training.export.verdict import kernel_verdict
from training.loading import AnySplit, Director, RunBackbone
from training.posthoc.conformal import score_rules, write_conformal
from training.posthoc.decision_figures import decisions_on_test
from training.posthoc.draws import shared_draws
from training.posthoc.modality_parts import ExportParts, artifact_info, export_parts
from training.posthoc.rollout_diagnostics import split_rollout_trace
from training.posthoc.served_path import ServedPath, fit_served_path
from training.posthoc.served_statistics import choose_default_samples, fit_noise_scale, fit_noise_shape
from training.posthoc.writing import (
    git_commit,
    install_version,
    script_path,
    serve_path,
    source_record,
    staging_dir,
    write_manifest,
)
from training.runtime import StepProgress, set_threads

EXPORT_STEPS = ("noise temperature and default S", "DIRECTOR's artifact and feature statistics",
                "the paths' temperatures, OOD scores and thresholds", "the kernel's verdict", "test split",
                "manifest and version", "results page")


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
    opened = RunBackbone.open(cfg.run_dir)  # backbone.pt read once
    director, payload = opened.director()
    return ExportRun(cfg, director, payload, opened.backbone, opened.payload,
                     export_parts(cfg, opened.family, opened.backbone))


def stage_artifact(run: ExportRun, tmp_dir: Path) -> tuple[torch.nn.Module, torch.jit.ScriptModule]:
    """The TorchScript artifact (adaLN folded into per-step buffers) with every per-input score, and the modality's
    files, written into the staging folder; returns the eager artifact module and the scripted one (the statistics
    and the OOD score's choice are measured on it)."""
    artifact_module, served = run.parts.build_artifact(run.director, tmp_dir / ARTIFACT)
    for name, source in run.parts.files.items():
        shutil.copyfile(source, tmp_dir / name)
    return artifact_module, served


def provenance(run: ExportRun, sampling: SamplingChoice, temperature_fit: dict[str, Any], figures: SplitFigures,
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


def version_manifest(run: ExportRun, path: ServedPath, sampling: SamplingChoice, verdict: KernelVerdict,
                     provenance: Provenance, tmp_dir: Path, conformal: Conformal | None = None) -> Manifest:
    """The version's manifest for the served ``path``: DIRECTOR (its depth, noise and variance; the depth under
    ``sampling.depth`` alone, which older manifests also carry as ``sampling.steps``), the hybrid or the post-hoc path
    (nothing sampled: every sample the same row, any S up to ``export.max_samples`` accepted; the hybrid's kernel
    depth is in the verdict's cost)."""
    cfg, payload, stats = run.cfg, run.payload, path.stats
    served_by_score = temperature_by_score(path)
    depth = run.director.rollout.num_steps
    director = path.method == "director"
    sampling_section = Sampling(
        depth=depth if director else 0, backbone_steps=payload["backbone_steps"],
        prefix_transitions=payload["backbone_steps"] - depth if director else payload["backbone_steps"],
        default_samples=path.default_samples, max_samples=cfg.export.max_samples,
        **({"noise_scale": sampling.noise_scale} if director else {}),
        **({"token_correlation": sampling.token_correlation} if director and sampling.token_correlation else {}))
    variance = Variance(observed_variance=payload["observed_variance"], tau=payload["tau"],
                        floors=[float(f) for f in payload["floors"]],
                        tau_selection_accuracy=payload["tau_accuracies"]) if director else None
    return Manifest(
        format_version=FORMAT_VERSION, name=cfg.export.name, version=str(cfg.export.version), method=path.method,
        modality=cfg.modality, labels=list(run.parts.data.labels), input=run.parts.input_section,
        sampling=sampling_section, **({"variance": variance} if variance else {}), temperature=path.temperature,
        ood=stats.ood,
        reference=stats.reference, kernel_verdict=verdict,
        **({"temperature_by_score": served_by_score} if served_by_score is not None else {}),
        artifact=artifact_info(run.parts, path.module), provenance=provenance,
        **({"conformal": conformal} if conformal is not None else {}), files=file_digests(tmp_dir))


def temperature_by_score(path: ServedPath) -> TemperatureByScore | None:
    """The manifest's per-input temperature of ``path``, when its fit kept a slope above 0."""
    by_score = path.by_score
    return TemperatureByScore(**by_score.record) if by_score is not None and by_score.temperature is not None else None


def conformal_part(run: ExportRun, path: ServedPath, tmp_dir: Path) -> Conformal | None:
    """The version's prediction sets and abstentions (``training.posthoc.conformal``), from the served path's
    probabilities on the calibration split carved off validation; None when ``export.calibration_share`` is 0."""
    calibration, ecfg = run.parts.calibration, run.cfg.export
    if calibration is None:
        return None
    probs = path.inputs("calibration", calibration, run.cfg.seed + 5).summary.probabilities  # [n, C]
    scores = list(ecfg.conformal_scores)
    return write_conformal(probs, calibration.labels, scores, scores[0], ecfg.raps_penalty, ecfg.raps_free_ranks,
                           ecfg.selective_delta, calibration_description(calibration, ecfg.calibration_share), tmp_dir)


def served_decisions(run: ExportRun, path: ServedPath, conformal: Conformal) -> dict[str, Any]:
    """The test split's sets and abstentions as a request gets them by default (``decisions_on_test``), from the
    served path's probabilities on the calibration and test splits (the draws ``conformal_part`` and the test figures
    made)."""
    calibration, test, seed = run.parts.calibration, run.parts.data.test, run.cfg.seed
    assert calibration is not None  # a conformal part was written from it
    rule = score_rules([conformal.default_score], conformal.raps_penalty,
                       conformal.raps_free_ranks)[conformal.default_score]
    return decisions_on_test(path.inputs("calibration", calibration, seed + 5).summary.probabilities,
                                calibration.labels, path.inputs("test", test, seed).summary.probabilities,
                                test.labels, rule, conformal.selective_delta)


def write_reports(run: ExportRun, manifest: Manifest, figures: SplitFigures) -> None:
    """The run's export report (the manifest as written), the reliability diagram and the results page, the page
    read from the manifest as the server parses it."""
    cfg, ecfg = run.cfg, run.cfg.export
    document = manifest.document()
    (Path(cfg.run_dir) / "export_report.json").write_text(json.dumps(document, indent=2) + "\n")
    docs_dir = Path(ecfg.docs_dir)
    png = reliability_diagram(figures.probabilities, run.parts.data.test.labels,
                              docs_dir / f"{ecfg.name}-reliability.png")
    write_results(parse_manifest(document), docs_dir, reproduce_command(cfg, run.payload, run.backbone_payload), png)


def served_paths(run: ExportRun, sampling: SamplingChoice, artifact_module: torch.nn.Module,
                 served: torch.jit.ScriptModule, shift: HeldOutShift) -> dict[str, ServedPath]:
    """DIRECTOR, the hybrid and the post-hoc path, each with its post-hoc tools fitted by the same rules on validation
    and its held-out ``shift``. The hybrid's and the post-hoc modules are scripted into the run folder (``PATH_FILES``);
    their one OOD threshold holds at every sample count (every sample is the same row)."""
    cfg, parts = run.cfg, run.parts
    val, families, probe = parts.data.val, parts.ood_families, parts.data.val.first_args(8)
    paths = {"director": fit_served_path("director", artifact_module, served, val, families, cfg,
                                         sampling.default_samples, cfg.export.sample_counts, shift, sampling.shift)}
    for method, build in (("hybrid", parts.build_hybrid), ("posthoc", parts.build_posthoc)):
        module = build(run.director, artifact_module)
        scripted = script_path(method, module, probe, Path(cfg.run_dir))
        path = fit_served_path(method, module, scripted, val, families, cfg, 1, [1], shift, None)
        path.stats.ood["thresholds"] = {str(n): path.stats.ood["thresholds"]["1"] for n in cfg.export.sample_counts}
        paths[method] = path
    return paths


def measure_test_split(run: ExportRun, verdict: KernelVerdict, paths: dict[str, ServedPath]
                       ) -> tuple[KernelVerdict, ServedPath, SplitFigures]:
    """The served path's test figures, and the verdict with the test split's accuracy among its comparisons
    (``training.export.backbone_accuracy``): where that turns it away from DIRECTOR, the figures are measured again
    with the new path served. Returns (verdict, served path, figures)."""
    figures = test_split_figures(paths, verdict.served, run.director, run.parts, run.backbone_parameters, run.cfg.seed)
    checked = with_test_split(verdict, figures.metrics, run.cfg.export)
    if checked.served != verdict.served:
        figures = test_split_figures(paths, checked.served, run.director, run.parts, run.backbone_parameters,
                                     run.cfg.seed)
    return checked, paths[checked.served], figures


def export(cfg: PipelineConfig, strict: bool = False) -> Path:
    """``export_version`` with each of its forward passes made once (``training.posthoc.draws``)."""
    with shared_draws():
        return export_version(cfg, strict)


def export_version(cfg: PipelineConfig, strict: bool = False) -> Path:
    """Calibrate the sampling, stage and verify the artifact, fit both paths' post-hoc tools, compare them (the
    kernel's verdict), then write the manifest of the one served, swap the version in and write the reports.
    ``strict``: refuse (``LessAccurateThanBackbone``) to publish a version less accurate than its backbone."""
    t_start = time.perf_counter()
    set_threads(cfg.threads)
    ecfg = cfg.export
    run = load_run(cfg)
    if cfg.task.multi_label:  # a sigmoid per label: its own calibration (training.export.multi_label)
        return export_multi_label(cfg, run.director, run.payload, run.backbone_payload, run.parts,
                                  run.backbone_parameters, strict)
    progress = StepProgress("export", EXPORT_STEPS)
    sampling = calibrate_sampling(run.director, run.parts, cfg)
    progress.done()
    out_dir = Path(ecfg.repository) / ecfg.name / str(ecfg.version)
    tmp_dir = staging_dir(out_dir)
    artifact_module, served = stage_artifact(run, tmp_dir)
    progress.done()
    shift = held_out_shift(cfg, run.parts.data.val)  # one held-out shift for both paths and the verdict
    paths = served_paths(run, sampling, artifact_module, served, shift)
    progress.done()
    verdict = kernel_verdict(paths, run.parts, shift, cfg, run.backbone_parameters)
    progress.done()
    verdict, path, figures = measure_test_split(run, verdict, paths)
    diagnostics = split_rollout_trace(run.director, run.parts.data.test.head(500), cfg.seed)
    progress.done()
    if strict:
        refuse_unless_as_accurate(verdict, tmp_dir, out_dir)
    conformal = conformal_part(run, path, tmp_dir)
    if conformal is not None:
        figures.metrics["decisions"] = served_decisions(run, path, conformal)
    record = provenance(run, sampling, path.temperature_fit, figures, diagnostics, time.perf_counter() - t_start)
    serve_path(Path(cfg.run_dir), path.method, tmp_dir)
    read = scores_read(Ood.model_validate(path.stats.ood), temperature_by_score(path))  # what scored_rows keeps
    finish_artifact(run.parts, ecfg.format, path.module, path.served, read, tmp_dir)
    manifest = version_manifest(run, path, sampling, verdict, record, tmp_dir, conformal)
    write_manifest(tmp_dir, manifest)
    install_version(tmp_dir, out_dir)
    progress.done()
    write_reports(run, manifest, figures)
    progress.done()
    metrics = figures.metrics
    served_block = metrics[path.method] if path.method != "director" else metrics[f"director_s{path.default_samples}"]
    by_score = path.by_score.temperature if path.by_score else None
    slope = "" if by_score is None else f" x exp({by_score.slope:g} * score)"
    print(f"exported {out_dir} (method {manifest.method}, S={path.default_samples}, T={path.temperature:.3f}{slope}, "
          f"OOD score {manifest.ood.score}); test: backbone acc {metrics['backbone']['accuracy']:.4f} "
          f"ece {metrics['backbone']['ece']:.4f}, served acc {served_block['accuracy']:.4f} "
          f"ece {served_block['ece']:.4f}")
    print(f"kernel verdict: {verdict.sentence}")
    warning = backbone_warning(verdict)
    if warning is not None:
        print(f"warning: {warning}")
    return out_dir
