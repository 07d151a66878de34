"""The export of a multi-label run (``task.kind: multi_label``; docs/method.md, "Multi-label models"): the same
artifacts as a single-label export (DIRECTOR's kernel, the hybrid and the post-hoc path, the readout's logits per
label, the feature-space scores fitted without classes: ``training.posthoc.feature_statistics``), with a sigmoid per
label read by the server from the manifest's ``task``. Each path gets the same post-hoc tools on validation
(``training.export.label_paths``: the temperature, one or per label, each label's threshold, the OOD score chosen over
the OOD-validation families with its thresholds per sample count, the reference distributions); the kernel's verdict
(``training.export.label_verdict``) compares them paired and ``export.method`` decides which one the version
serves, as for a single-label model (three-way). With a calibration split (``export.calibration_share``), the served
path's label sets with a recall guarantee (``training.export.label_recall``) answer a request's ``coverage``. Not
fitted for a multi-label model: abstentions (``max_risk``), a temperature that follows the OOD score, the noise shaped
on a held-out shift (DIRECTOR samples at ``export.default_samples`` with the first noise scale of the grid); the
manifest says so. Measured on test: the backbone's figures, every path's and the served path's label sets."""

from __future__ import annotations

import datetime as dt
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from artifact.contract import (
    ARTIFACT,
    FORMAT_VERSION,
    KernelVerdict,
    Manifest,
    Provenance,
    Reference,
    Sampling,
    Variance,
    file_digests,
)
from artifact.contract import MultiLabel as MultiLabelSection
from artifact.multi_label import LabelRecall
from models.tasks import MULTI_LABEL
from training.config import PipelineConfig
from training.data.held_out_shift import held_out_shift
from training.export.backbone_accuracy import backbone_warning, refuse_unless_as_accurate, with_test_split
from training.export.final_artifact import finish_artifact
from training.export.label_calibration import LabelCalibration
from training.export.label_paths import LabelPath, fit_label_path, test_figures, test_probabilities
from training.export.label_recall import label_sets_on_test, write_label_recall
from training.export.label_verdict import label_verdict
from training.export.model_page import backbone_warning_section, verdict_section
from training.export.verdict import PATH_NAMES
from training.loading import Director
from training.posthoc.modality_parts import ExportParts, artifact_info
from training.posthoc.writing import (
    git_commit,
    install_version,
    script_path,
    serve_path,
    source_record,
    staging_dir,
    write_manifest,
)
from training.runtime import StepProgress

OOD_NOTE = ("the feature-space statistics hold one mean, the training features' (multi-label inputs name no single "
            "class): mds is the Mahalanobis distance to it; energy is the joint energy -sum softplus(z)")
EXPORT_STEPS = ("DIRECTOR's artifact, the hybrid's and the post-hoc path's",
                "the paths' temperatures, thresholds and OOD scores",
                "the kernel's verdict", "test split", "label sets with a recall guarantee", "manifest and version",
                "results page")


def multi_label_section(calibration: LabelCalibration, label_ece: list[float], recall: LabelRecall | None
                        ) -> MultiLabelSection:
    choice = calibration.temperature
    return MultiLabelSection(thresholds=calibration.thresholds, threshold_rule=calibration.threshold_rule,
                             temperatures=choice.per_label, temperature_rule=choice.rule, temperature_fit=choice.fit,
                             label_ece=label_ece, ood_note=OOD_NOTE, **({"recall": recall} if recall else {}))


def provenance(cfg: PipelineConfig, parts: ExportParts, payload: dict[str, Any], backbone_payload: dict[str, Any],
               figures: dict[str, Any], seconds: float) -> Provenance:
    return Provenance(
        backbone=parts.backbone_description, dataset=cfg.data.dataset, config=cfg.source, seed=cfg.seed,
        git_commit=git_commit(), date=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), test_metrics=figures,
        seconds={"fit_backbone": backbone_payload["seconds"], "distil": payload["seconds"],
                 "export": round(seconds, 1)},
        distil_history=payload["history"], distil_kept_epoch=payload["kept_epoch"],
        **({"sources": {"checkpoint": source_record(cfg.pretrained.source),
                        "checkpoint_weights": source_record(cfg.pretrained.checkpoint),
                        "data": source_record(cfg.data.root)}} if cfg.pretrained.source is not None else {}))


def label_sets_section(section: MultiLabelSection, measured: dict[str, Any] | None) -> list[str]:
    """The page's lines on the label sets a request's ``coverage`` gets: their guarantee and what they gave on test."""
    if section.recall is None or not measured:
        return ["No label sets: the export had no calibration split (`export.calibration_share` 0), so the version "
                "answers no `coverage`.", ""]
    rows = [f"| {coverage} | {m['threshold']:.4f} | {100 * m['recall']:.1f} +- {100 * m['recall_se']:.1f} | "
            f"{m['mean_size']:.2f} |" for coverage, m in measured.items()]
    return ["## Label sets with a recall guarantee", "",
            f"A request's `coverage` returns every label whose probability reaches a threshold chosen by conformal "
            f"risk control on {section.recall.n} calibration inputs ({section.recall.entries} true labels), so that "
            "on average the set holds at least that share of an input's true labels. On the test split:", "",
            "| coverage | threshold | mean recall % (+- s.e.) | mean set size |", "| --- | --- | --- | --- |",
            *rows, ""]


def write_page(cfg: PipelineConfig, manifest: Manifest) -> None:
    """The version's results page (``export.docs_dir``/<name>.md): its labels, thresholds and figures, and the kernel's
    verdict with its paired comparisons."""
    section, figures = manifest.multi_label, (manifest.provenance.test_metrics or {}) if manifest.provenance else {}
    assert section is not None
    rows = "\n".join(f"| {label} | {threshold:.2f} | {ece:.4f} |" for label, threshold, ece
                     in zip(manifest.labels, section.thresholds, section.label_ece or [], strict=False))
    director = manifest.method == "director"
    served = figures.get(f"director_s{manifest.sampling.default_samples}" if director else manifest.method, {})
    what = f"DIRECTOR at S = {manifest.sampling.default_samples}" if director else PATH_NAMES[manifest.method]
    page = "\n".join([
        f"# {manifest.name} version {manifest.version} (multi-label)", "", *backbone_warning_section(manifest),
        f"A sigmoid per label; serves {what}, temperature rule {section.temperature_rule}, thresholds "
        f"{section.threshold_rule}, OOD score {manifest.ood.score}.", "", "| label | threshold | validation ECE |",
        "| --- | --- | --- |", rows, "",
        f"Test ({figures.get('n')} inputs): served accuracy (per label) {served.get('accuracy', float('nan')):.4f}, "
        f"macro F1 {served.get('macro_f1', float('nan')):.4f}, mean label ECE {served.get('ece', float('nan')):.4f}; "
        f"backbone accuracy {figures.get('backbone', {}).get('accuracy', float('nan')):.4f}.", "",
        *label_sets_section(section, figures.get("label_sets")), *verdict_section(manifest)])
    docs = Path(cfg.export.docs_dir)
    docs.mkdir(parents=True, exist_ok=True)
    (docs / f"{cfg.export.name}.md").write_text(page)


def label_manifest(cfg: PipelineConfig, path: LabelPath, director: Director, payload: dict[str, Any],
                   parts: ExportParts, verdict: KernelVerdict, record: Provenance, recall: LabelRecall | None,
                   tmp_dir: Path) -> Manifest:
    """The manifest of the served ``path``: DIRECTOR (its depth, noise and variance), the hybrid or the post-hoc path
    (nothing sampled: every sample the same row)."""
    ecfg, kernel = cfg.export, path.method == "director"
    reference, eces = path.reference(parts.data.val.labels)
    depth = director.rollout.num_steps
    steps = payload["backbone_steps"]
    sampling = Sampling(depth=depth if kernel else 0, backbone_steps=steps,
                        prefix_transitions=steps - depth if kernel else steps, default_samples=path.default_s,
                        max_samples=ecfg.max_samples,
                        **({"noise_scale": float(director.rollout.noise_scale)} if kernel else {}))
    variance = Variance(observed_variance=payload["observed_variance"], tau=payload["tau"],
                        floors=[float(f) for f in payload["floors"]],
                        tau_selection_accuracy=payload["tau_accuracies"]) if kernel else None
    return Manifest(
        format_version=FORMAT_VERSION, name=ecfg.name, version=str(ecfg.version), method=path.method,
        modality=cfg.modality, labels=list(parts.data.labels), task=MULTI_LABEL,
        multi_label=multi_label_section(path.calibration, eces, recall), input=parts.input_section, sampling=sampling,
        **({"variance": variance} if variance else {}), temperature=path.calibration.temperature.temperature,
        ood=path.ood, reference=Reference(**reference), kernel_verdict=verdict,
        artifact=artifact_info(parts, path.module), provenance=record, files=file_digests(tmp_dir))


def stage_artifacts(cfg: PipelineConfig, director: Director, parts: ExportParts, tmp_dir: Path
                    ) -> dict[str, tuple[torch.nn.Module, torch.jit.ScriptModule]]:
    """DIRECTOR's artifact and the modality's files staged, and the hybrid's and the post-hoc path's modules scripted
    into the run folder: method -> (eager module, its scripted form)."""
    artifact_module, served = parts.build_artifact(director, tmp_dir / ARTIFACT)
    for name, source in parts.files.items():
        shutil.copyfile(source, tmp_dir / name)
    staged = {"director": (artifact_module, served)}
    for method, build in (("hybrid", parts.build_hybrid), ("posthoc", parts.build_posthoc)):
        module = build(director, artifact_module)
        staged[method] = (module, script_path(method, module, parts.data.val.first_args(8), Path(cfg.run_dir)))
    return staged


def export_multi_label(cfg: PipelineConfig, director: Director, payload: dict[str, Any],
                       backbone_payload: dict[str, Any], parts: ExportParts, backbone_parameters: int,
                       strict: bool = False) -> Path:
    """Stage the three paths, fit their post-hoc tools, compare them (the kernel's verdict), then write the manifest of
    the one served and install the version; returns its folder. ``strict``: refuse (``LessAccurateThanBackbone``) to
    publish a DIRECTOR less accurate than its backbone."""
    started, ecfg, seed = time.perf_counter(), cfg.export, cfg.seed
    progress = StepProgress("export", EXPORT_STEPS)
    director.rollout.noise_scale.fill_(float((ecfg.noise_scale_grid or [1.0])[0]))
    default_s = ecfg.default_samples or ecfg.default_samples_reference
    out_dir = Path(ecfg.repository) / ecfg.name / str(ecfg.version)
    tmp_dir = staging_dir(out_dir)
    staged = stage_artifacts(cfg, director, parts, tmp_dir)
    progress.done()
    paths = {method: fit_label_path(method, module, served, parts, cfg, default_s if method == "director" else 1)
             for method, (module, served) in staged.items()}
    progress.done()
    verdict = label_verdict(paths, parts, held_out_shift(cfg, parts.data.val), cfg, backbone_parameters)
    progress.done()
    probs = test_probabilities(parts.data.test, paths, seed)
    figures = test_figures(parts, paths, probs)
    verdict = with_test_split(verdict, figures, ecfg)
    path = paths[verdict.served]
    progress.done()
    if strict:
        refuse_unless_as_accurate(verdict, tmp_dir, out_dir)
    recall = None
    if parts.calibration is not None:
        recall, table = write_label_recall(path, parts.calibration, ecfg.calibration_share, seed, tmp_dir)
        figures["label_sets"] = label_sets_on_test(table, probs[path.method], parts.data.test.labels)
    progress.done()
    serve_path(Path(cfg.run_dir), path.method, tmp_dir)
    finish_artifact(parts, ecfg.format, path.module, path.served, {path.rule.score}, tmp_dir)
    record = provenance(cfg, parts, payload, backbone_payload, figures, time.perf_counter() - started)
    manifest = label_manifest(cfg, path, director, payload, parts, verdict, record, recall, tmp_dir)
    write_manifest(tmp_dir, manifest)
    install_version(tmp_dir, out_dir)
    progress.done()
    write_page(cfg, manifest)
    progress.done()
    served = figures[path.method if path.method != "director" else f"director_s{default_s}"]
    print(f"exported {out_dir} (multi-label, method {path.method}, S={path.default_s}, temperature "
          f"{path.calibration.temperature.rule}, OOD score {path.rule.score}); test: backbone acc "
          f"{figures['backbone']['accuracy']:.4f}, served acc {served['accuracy']:.4f} macro F1 "
          f"{served['macro_f1']:.4f} ece {served['ece']:.4f}")
    sets = figures.get("label_sets", {}).get("0.9")
    if sets is not None:
        print(f"label sets at coverage 0.9 (test): mean recall {sets['recall']:.3f}, mean size {sets['mean_size']:.2f} "
              f"of {len(parts.data.labels)} labels")
    print(f"kernel verdict: {verdict.sentence}")
    warning = backbone_warning(verdict)
    if warning is not None:
        print(f"warning: {warning}")
    return out_dir
