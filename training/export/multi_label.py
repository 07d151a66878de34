"""The export of a multi-label run (``task.kind: multi_label``; docs/method.md, "Multi-label models"): the same
artifact as a single-label DIRECTOR (the kernel, the readout's logits per label, the feature-space scores fitted
without classes: ``training.export.feature_statistics``), with a sigmoid per label read by the server from the
manifest's ``task``. What the single-label export fits around the softmax (the kernel's verdict against the post-hoc
path, prediction sets and abstentions, a temperature that follows the OOD score, the noise shaped on a held-out
shift) is not fitted: the version serves DIRECTOR at ``export.default_samples`` with the first noise scale of the
grid, and the manifest says so. Fitted on validation: the temperature (one or per label), each label's threshold,
the OOD score (the joint energy or a per-input score, chosen over the OOD-validation families by the single-label
export's rule) with its thresholds per sample count, and the reference distributions; measured on test: the
backbone's and the served figures."""

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
    Manifest,
    Ood,
    Provenance,
    Reference,
    Sampling,
    Variance,
    file_digests,
)
from artifact.contract import MultiLabel as MultiLabelSection
from models.tasks import MULTI_LABEL
from models.uncertainty import ood_score
from training.config import PipelineConfig
from training.data.ood_families import OodFamily, selection_description
from training.export.final_artifact import finish_artifact
from training.export.label_calibration import LabelCalibration, calibrate_labels, multi_label_reference
from training.export.ood_selection import SELECTION_RULE, InputScoreCache, generalising, mean_auroc
from training.export.parts import ExportParts, artifact_info
from training.export.served_statistics import sample_split
from training.export.writing import git_commit, install_version, source_record, staging_dir, write_manifest
from training.loading import AnySplit, Director
from training.multi_label_metrics import multi_label_report
from training.ood_metrics import auroc, threshold_at_tpr

# the candidates, simplest first: the joint energy of the logits, then the per-input scores the artifact returns (rmds
# is 0 with one mean and is no candidate)
OOD_CANDIDATES = ("energy", "mds", "knn", "vim", "kernel_error")
OOD_NOTE = ("the feature-space statistics hold one mean, the training features' (multi-label inputs name no single "
            "class): mds is the Mahalanobis distance to it; energy is the joint energy -sum softplus(z)")


class OodRuleFit:
    """The served OOD score, chosen over the OOD-validation families by the single-label export's rule
    (``training.export.ood_selection.SELECTION_RULE``: the lowest worst-case regret), and its 95%-TPR threshold on
    validation at each sample count."""

    def __init__(self, served: torch.nn.Module, val: AnySplit, val_logits: torch.Tensor, calibration: LabelCalibration,
                 seed: int, families: dict[str, OodFamily]) -> None:
        """``val_logits`` [S, N, C]: the export's draws of ``val`` at the default S."""
        self.served, self.val, self.calibration, self.seed = served, val, calibration, seed
        scores = InputScoreCache(served)
        self.inputs = scores("val", val)
        candidates = [name for name in OOD_CANDIDATES if name == "energy" or (self.inputs and name in self.inputs)]
        task, temperature = calibration.task(), calibration.temperature.temperature
        val_summary = task.summarize(val_logits, temperature)
        val_values = {name: ood_score(val_summary, name, self.inputs) for name in candidates}  # name -> [N]
        self.family_auroc: dict[str, dict[str, float]] = {}  # family -> candidate -> AUROC against validation
        for family_name, family in families.items():
            summary = task.summarize(sample_split(served, family.split, val_logits.shape[0], seed + 1), temperature)
            inputs = scores(family_name, family.split)
            self.family_auroc[family_name] = {name: auroc(val_values[name], ood_score(summary, name, inputs))
                                              for name in candidates}
        self.families = families
        weights = {name: family.weight for name, family in families.items()}
        self.score = generalising(candidates, self.family_auroc, weights) if families else candidates[0]
        self.selection_auroc = {name: mean_auroc(self.family_auroc, weights, name) for name in candidates} \
            if families else None

    def values(self, logits: torch.Tensor) -> torch.Tensor:
        """The served score per validation input [N] from its draws [S, N, C]."""
        summary = self.calibration.task().summarize(logits, self.calibration.temperature.temperature)
        return ood_score(summary, self.score, self.inputs)

    def section(self, counts: list[int], default_s: int, val_logits: torch.Tensor) -> Ood:
        thresholds = {}
        for n in counts:
            logits = val_logits if n == default_s else sample_split(self.served, self.val, n, self.seed)
            thresholds[n] = {"score": self.score, "threshold": threshold_at_tpr(self.values(logits))}
        families = {name: {"description": family.description, "weight": family.weight, "n": len(family.split),
                           "auroc": self.family_auroc[name]} for name, family in self.families.items()}
        return Ood(score=self.score, fallback_score=self.score, tpr=0.95, thresholds=thresholds,
                   selection_set=selection_description(self.families) or None, selection_auroc=self.selection_auroc,
                   selection_choice=self.score, selection_rule=SELECTION_RULE, selection_families=families)


def test_figures(parts: ExportParts, served: torch.nn.Module, calibration: LabelCalibration, default_s: int,
                 seed: int) -> dict[str, Any]:
    """The test split: the backbone (sigmoid, thresholds 0.5) and the served version (its calibration)."""
    test = parts.data.test
    backbone = torch.sigmoid(parts.backbone_logits(test).float())  # [N, C]
    logits = sample_split(served, test, default_s, seed + 3)  # [S, N, C]
    return {"backbone": multi_label_report(backbone, test.labels),
            f"director_s{default_s}": multi_label_report(calibration.probabilities(logits), test.labels,
                                                         calibration.thresholds),
            "n": len(test)}


def multi_label_section(calibration: LabelCalibration, label_ece: list[float]) -> MultiLabelSection:
    choice = calibration.temperature
    return MultiLabelSection(thresholds=calibration.thresholds, threshold_rule=calibration.threshold_rule,
                             temperatures=choice.per_label, temperature_rule=choice.rule, temperature_fit=choice.fit,
                             label_ece=label_ece, ood_note=OOD_NOTE)


def provenance(cfg: PipelineConfig, parts: ExportParts, payload: dict[str, Any], backbone_payload: dict[str, Any],
               figures: dict[str, Any], seconds: float) -> Provenance:
    return Provenance(
        backbone=parts.backbone_description, dataset=cfg.data.dataset, config=cfg.source, seed=cfg.seed,
        git_commit=git_commit(), date=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), test_metrics=figures,
        seconds={"fit_backbone": backbone_payload["seconds"], "distil": payload["seconds"],
                 "export": round(seconds, 1)},
        kernel_verdict="not measured for a multi-label model: DIRECTOR is served",
        distil_history=payload["history"], distil_kept_epoch=payload["kept_epoch"],
        **({"sources": {"checkpoint": source_record(cfg.pretrained.source),
                        "checkpoint_weights": source_record(cfg.pretrained.checkpoint),
                        "data": source_record(cfg.data.root)}} if cfg.pretrained.source is not None else {}))


def write_page(cfg: PipelineConfig, manifest: Manifest) -> None:
    """The version's short results page (``export.docs_dir``/<name>.md): its labels, thresholds and figures."""
    section, figures = manifest.multi_label, (manifest.provenance.test_metrics or {}) if manifest.provenance else {}
    assert section is not None
    rows = "\n".join(f"| {label} | {threshold:.2f} | {ece:.4f} |" for label, threshold, ece
                     in zip(manifest.labels, section.thresholds, section.label_ece or [], strict=False))
    served = figures.get(f"director_s{manifest.sampling.default_samples}", {})
    page = (f"# {manifest.name} version {manifest.version} (multi-label)\n\nA sigmoid per label; S = "
            f"{manifest.sampling.default_samples}, temperature rule {section.temperature_rule}, thresholds "
            f"{section.threshold_rule}, OOD score {manifest.ood.score}.\n\n| label | threshold | validation ECE |\n"
            f"| --- | --- | --- |\n{rows}\n\nTest ({figures.get('n')} inputs): served accuracy (per label) "
            f"{served.get('accuracy', float('nan')):.4f}, macro F1 {served.get('macro_f1', float('nan')):.4f}, mean "
            f"label ECE {served.get('ece', float('nan')):.4f}; backbone accuracy "
            f"{figures.get('backbone', {}).get('accuracy', float('nan')):.4f}.\n")
    docs = Path(cfg.export.docs_dir)
    docs.mkdir(parents=True, exist_ok=True)
    (docs / f"{cfg.export.name}.md").write_text(page)


def export_multi_label(cfg: PipelineConfig, director: Director, payload: dict[str, Any],
                       backbone_payload: dict[str, Any], parts: ExportParts) -> Path:
    """Stage, calibrate, measure and install the version; returns its folder."""
    started, ecfg, seed = time.perf_counter(), cfg.export, cfg.seed
    if ecfg.method == "posthoc":
        raise ValueError("a multi-label model serves DIRECTOR: --method posthoc is for single-label models")
    director.rollout.noise_scale.fill_(float((ecfg.noise_scale_grid or [1.0])[0]))
    default_s = ecfg.default_samples or ecfg.default_samples_reference
    out_dir = Path(ecfg.repository) / ecfg.name / str(ecfg.version)
    tmp_dir = staging_dir(out_dir)
    artifact_module, served = parts.build_artifact(director, tmp_dir / ARTIFACT)
    for name, source in parts.files.items():
        shutil.copyfile(source, tmp_dir / name)
    val = parts.data.val
    val_logits = sample_split(served, val, default_s, seed)  # [S, N, C]
    calibration = calibrate_labels(val_logits, val.labels, cfg.task.temperature, cfg.task.thresholds, seed)
    head = val.head(ecfg.threshold_images)
    rule = OodRuleFit(served, head, val_logits[:, : len(head)], calibration, seed, parts.ood_families)
    ood = rule.section(ecfg.sample_counts, default_s, val_logits[:, : len(head)])
    threshold = ood.thresholds[default_s].threshold
    n = len(rule.val)  # the reference is measured where the OOD scores were
    reference, eces = multi_label_reference(calibration, val_logits[:, :n], val.labels[:n],
                                            rule.values(val_logits[:, :n]), threshold)
    figures = test_figures(parts, served, calibration, default_s, seed)
    finish_artifact(parts, ecfg.format, artifact_module, served, {rule.score}, tmp_dir)
    depth = director.rollout.num_steps
    manifest = Manifest(
        format_version=FORMAT_VERSION, name=ecfg.name, version=str(ecfg.version), method="director",
        modality=cfg.modality, labels=list(parts.data.labels), task=MULTI_LABEL,
        multi_label=multi_label_section(calibration, eces), input=parts.input_section,
        sampling=Sampling(depth=depth, backbone_steps=payload["backbone_steps"],
                          prefix_transitions=payload["backbone_steps"] - depth, default_samples=default_s,
                          max_samples=ecfg.max_samples, noise_scale=float(director.rollout.noise_scale)),
        variance=Variance(observed_variance=payload["observed_variance"], tau=payload["tau"],
                          floors=[float(f) for f in payload["floors"]],
                          tau_selection_accuracy=payload["tau_accuracies"]),
        temperature=calibration.temperature.temperature, ood=ood, reference=Reference(**reference),
        artifact=artifact_info(parts, artifact_module),
        provenance=provenance(cfg, parts, payload, backbone_payload, figures, time.perf_counter() - started),
        files=file_digests(tmp_dir))
    write_manifest(tmp_dir, manifest)
    install_version(tmp_dir, out_dir)
    write_page(cfg, manifest)
    served_figures = figures[f"director_s{default_s}"]
    print(f"exported {out_dir} (multi-label, S={default_s}, temperature {calibration.temperature.rule}, OOD score "
          f"{rule.score}); test: backbone acc {figures['backbone']['accuracy']:.4f}, served acc "
          f"{served_figures['accuracy']:.4f} macro F1 {served_figures['macro_f1']:.4f} ece {served_figures['ece']:.4f}")
    return out_dir
