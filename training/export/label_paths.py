"""The two paths a multi-label export can serve (docs/method.md, "Multi-label models"): DIRECTOR at its default S and
the post-hoc path (the backbone's own forward, ``models.posthoc``), each given the same post-hoc tools by the same
rules on the same validation inputs: the temperature (one or per label), each label's threshold, the OOD score chosen
over the OOD-validation families with its thresholds per sample count, and the reference distributions. The kernel's
verdict (``training.export.label_verdict``) compares them; the version serves one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from artifact.contract import Ood
from models.uncertainty import ood_score
from training.config import PipelineConfig
from training.data.ood_families import OodFamily, selection_description
from training.export.label_calibration import LabelCalibration, calibrate_labels, multi_label_reference
from training.loading import AnySplit
from training.multi_label_metrics import multi_label_report
from training.ood_metrics import auroc, threshold_at_tpr
from training.posthoc.modality_parts import ExportParts
from training.posthoc.ood_selection import SELECTION_RULE, InputScoreCache, generalising, mean_auroc
from training.posthoc.served_statistics import paired_difference, sample_split

# the candidates, simplest first: the joint energy of the logits, then the per-input scores the artifact returns (rmds
# is 0 with one mean and is no candidate; the post-hoc path returns no kernel error)
OOD_CANDIDATES = ("energy", "mds", "knn", "vim", "kernel_error")


class OodRuleFit:
    """The served OOD score, chosen over the OOD-validation families by the single-label export's rule
    (``training.posthoc.ood_selection.SELECTION_RULE``: the lowest worst-case regret), and its 95%-TPR threshold on
    validation at each sample count. Every candidate's values on validation and on each family are kept: the verdict
    compares the served one."""

    def __init__(self, served: torch.nn.Module, val: AnySplit, val_logits: torch.Tensor, calibration: LabelCalibration,
                 seed: int, families: dict[str, OodFamily]) -> None:
        """``val_logits`` [S, N, C]: the export's draws of ``val`` at the path's default S."""
        self.served, self.val, self.calibration, self.seed = served, val, calibration, seed
        scores = InputScoreCache(served)
        self.inputs = scores("val", val)
        candidates = [name for name in OOD_CANDIDATES if name == "energy" or (self.inputs and name in self.inputs)]
        task, temperature = calibration.task(), calibration.temperature.temperature
        val_summary = task.summarize(val_logits, temperature)
        self.val_values = {name: ood_score(val_summary, name, self.inputs) for name in candidates}  # name -> [N]
        self.family_values: dict[str, dict[str, torch.Tensor]] = {}  # family -> candidate -> [M]
        for family_name, family in families.items():
            summary = task.summarize(sample_split(served, family.split, val_logits.shape[0], seed + 1), temperature)
            inputs = scores(family_name, family.split)
            self.family_values[family_name] = {name: ood_score(summary, name, inputs) for name in candidates}
        self.family_auroc = {family: {name: auroc(self.val_values[name], values[name]) for name in candidates}
                             for family, values in self.family_values.items()}  # family -> candidate -> AUROC
        self.families = families
        weights = {name: family.weight for name, family in families.items()}
        self.score = generalising(candidates, self.family_auroc, weights) if families else candidates[0]
        self.selection_auroc = {name: mean_auroc(self.family_auroc, weights, name) for name in candidates} \
            if families else None

    @property
    def val_score(self) -> torch.Tensor:
        """The served score on validation [N] (the draws it was chosen on)."""
        return self.val_values[self.score]

    @property
    def family_scores(self) -> dict[str, torch.Tensor]:
        """The served score on each OOD-validation family [M]."""
        return {family: values[self.score] for family, values in self.family_values.items()}

    def values(self, logits: torch.Tensor) -> torch.Tensor:
        """The served score per validation input [N] from its draws [S, N, C]."""
        summary = self.calibration.task().summarize(logits, self.calibration.temperature.temperature)
        return ood_score(summary, self.score, self.inputs)

    def section(self, counts: list[int], default_s: int, val_logits: torch.Tensor, deterministic: bool) -> Ood:
        """The manifest's OOD section: a threshold per sample count (one for all when every sample is the same row,
        ``deterministic``)."""
        thresholds = {}
        for n in counts:
            logits = val_logits if n == default_s or deterministic else sample_split(self.served, self.val, n,
                                                                                     self.seed)
            thresholds[n] = {"score": self.score, "threshold": threshold_at_tpr(self.values(logits))}
        families = {name: {"description": family.description, "weight": family.weight, "n": len(family.split),
                           "auroc": self.family_auroc[name]} for name, family in self.families.items()}
        return Ood(score=self.score, fallback_score=self.score, tpr=0.95, thresholds=thresholds,
                   selection_set=selection_description(self.families) or None, selection_auroc=self.selection_auroc,
                   selection_choice=self.score, selection_rule=SELECTION_RULE, selection_families=families)


@dataclass
class LabelPath:
    """One served path with its post-hoc tools, fitted on validation."""

    method: str  # "director" | "hybrid" | "posthoc"
    module: torch.nn.Module  # the eager artifact module
    served: torch.jit.ScriptModule  # its scripted form, which every figure is measured on
    default_s: int
    val_logits: torch.Tensor  # [S, N, C] validation draws at default_s
    calibration: LabelCalibration
    rule: OodRuleFit
    ood: Ood

    def probabilities(self, split: AnySplit, seed: int) -> torch.Tensor:
        """Served probabilities [N, C] of ``split`` (a draw at the default S under ``seed``)."""
        return self.calibration.probabilities(sample_split(self.served, split, self.default_s, seed))

    def reference(self, labels: torch.Tensor) -> tuple[dict[str, Any], list[float]]:
        """The manifest's reference and each label's validation ECE, measured where the OOD scores were."""
        n = len(self.rule.val)
        threshold = self.ood.thresholds[self.default_s].threshold
        logits = self.val_logits[:, :n]  # [S, n, C]
        return multi_label_reference(self.calibration, logits, labels[:n], self.rule.values(logits), threshold)


def fit_label_path(method: str, module: torch.nn.Module, served: torch.jit.ScriptModule, parts: ExportParts,
                   cfg: PipelineConfig, default_s: int) -> LabelPath:
    """``method``'s calibration on validation, its OOD score over the OOD-validation families and its thresholds at
    every sample count (the post-hoc path's and the hybrid's one threshold holds at all of them: their samples are one
    row)."""
    ecfg, seed, val = cfg.export, cfg.seed, parts.data.val
    val_logits = sample_split(served, val, default_s, seed)  # [S, N, C]
    calibration = calibrate_labels(val_logits, val.labels, cfg.task.temperature, cfg.task.thresholds, seed)
    head = val.head(ecfg.threshold_images)
    rule = OodRuleFit(served, head, val_logits[:, : len(head)], calibration, seed, parts.ood_families)
    ood = rule.section(ecfg.sample_counts, default_s, val_logits[:, : len(head)], deterministic=method != "director")
    return LabelPath(method, module, served, default_s, val_logits, calibration, rule, ood)


def right_decisions(probs: torch.Tensor, labels: torch.Tensor, thresholds: list[float]) -> torch.Tensor:
    """Each input's share of right yes/no decisions [N] (its Hamming accuracy) at ``thresholds`` [C]."""
    cut = torch.tensor(thresholds, dtype=probs.dtype)  # [C]
    return ((probs >= cut[None, :]) == labels.bool()).double().mean(-1)  # [N]


def test_probabilities(test: AnySplit, paths: dict[str, LabelPath], seed: int) -> dict[str, torch.Tensor]:
    """Every path's served probabilities ``[N, C]`` on the test split, keyed by method (one draw each)."""
    return {name: path.probabilities(test, seed + 3) for name, path in paths.items()}


def test_figures(parts: ExportParts, paths: dict[str, LabelPath], probs: dict[str, torch.Tensor]) -> dict[str, Any]:
    """The test split: the backbone (sigmoid, thresholds 0.5), every path as it would be served (``probs``, from
    ``test_probabilities``), and DIRECTOR's accuracy minus the post-hoc path's, paired per input (the verdict's
    test-split comparison reads it)."""
    test, kernel, plain = parts.data.test, paths["director"], paths["posthoc"]
    backbone = torch.sigmoid(parts.backbone_logits(test).float())  # [N, C]
    p_dir, p_post = probs["director"], probs["posthoc"]  # [N, C] each
    difference = (right_decisions(p_dir, test.labels, kernel.calibration.thresholds)
                  - right_decisions(p_post, test.labels, plain.calibration.thresholds))  # [N]
    mean, stderr = paired_difference(difference)
    return {"backbone": multi_label_report(backbone, test.labels),
            f"director_s{kernel.default_s}": multi_label_report(p_dir, test.labels, kernel.calibration.thresholds),
            **{name: multi_label_report(probs[name], test.labels, path.calibration.thresholds)
               for name, path in paths.items() if name != "director"},
            "director_default_samples": kernel.default_s,
            "director_minus_posthoc": {"accuracy": {"difference": mean,
                                                    "ci95": [mean - 1.96 * stderr, mean + 1.96 * stderr]}},
            "n": len(test)}
