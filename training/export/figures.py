"""The test-split figures an export records (provenance ``test_metrics``) and its results page shows: the backbone,
the temperature-scaled backbone, DIRECTOR as it would be served, the post-hoc path, the hybrid (when measured), the
paired difference of DIRECTOR and the post-hoc path, how often the backbone-forward paths' labels are the backbone's,
and the served path's OOD scores on the reported OOD sets (every path's served score beside them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from models.uncertainty import summarize, temperature_for
from training.loading import Director
from training.metrics import classification_report, ece_bootstrap, paired_bootstrap
from training.ood_metrics import auroc
from training.posthoc.calibration import fit_temperature
from training.posthoc.modality_parts import ExportParts
from training.posthoc.ood_selection import ScoreInputs
from training.posthoc.rollout_diagnostics import mean_logvar_score
from training.posthoc.served_path import ServedPath
from training.posthoc.served_statistics import sample_split


def metrics_block(probs: torch.Tensor, labels: torch.Tensor) -> dict[str, Any]:
    """Metrics of probabilities [N, C] with a bootstrap interval of the ECE."""
    _, low, high = ece_bootstrap(probs, labels)
    report = classification_report(probs, labels)
    return {**report, "ece_ci95": [low, high], "ece_half_width": (high - low) / 2, "n": int(labels.shape[0])}


@dataclass
class SplitFigures:
    metrics: dict[str, Any]
    probabilities: dict[str, torch.Tensor]  # method label -> test probabilities [N, C] (the reliability plot)
    backbone_temperature: float


def flagged_rate(path: ServedPath, score: torch.Tensor) -> float:
    """The share of inputs whose served score passes the path's threshold at its default S."""
    threshold = path.stats.ood["thresholds"][str(path.default_samples)]["threshold"]
    return float((score > threshold).float().mean())


def reported_ood(path: ServedPath, other: ServedPath, paths: dict[str, ServedPath], tests: dict[str, ScoreInputs],
                 director: Director, parts: ExportParts, seed: int) -> dict[str, Any]:
    """Per reported OOD set: the served path's reported scores' AUROC against the test split (and DIRECTOR's mean
    log-variance when DIRECTOR is served), its flagged rate, the ``other`` path's served score's AUROC and every
    path's (``tests``: each path's test inputs)."""
    test = parts.data.test
    served_test, other_test = tests[path.method], tests[other.method]
    choice = path.stats.choice
    reported = {**choice.reported(), choice.label: choice.chosen}  # the served score even where it is no best
    test_logvar = mean_logvar_score(director, test, seed) if path.method == "director" else None
    out: dict[str, Any] = {}
    for name, split in parts.reported_ood.items():
        inputs = path.inputs(name, split, seed)
        aurocs = {label: auroc(served_test.score(c.name, c.terms), inputs.score(c.name, c.terms))
                  for label, c in reported.items()}
        if test_logvar is not None:
            aurocs["mean_logvar"] = auroc(test_logvar, mean_logvar_score(director, split, seed))
        out[name] = {"mean_mutual_information": float(inputs.summary.mutual_information.mean()),
                     "auroc_vs_test": aurocs, "flagged_rate": flagged_rate(path, path.ood_score(inputs)),
                     "other_path_auroc": auroc(other.ood_score(other_test),
                                               other.ood_score(other.inputs(name, split, seed))),
                     "paths_auroc": {method: auroc(p.ood_score(tests[method]), p.ood_score(p.inputs(name, split, seed)))
                                     for method, p in paths.items()}}
    return out


def label_agreement(probs: torch.Tensor, backbone_logits: torch.Tensor) -> float:
    """The share of inputs whose served label is the backbone's own (probs [N, C], logits [N, C])."""
    return float((probs.argmax(-1) == backbone_logits.argmax(-1)).float().mean())


def test_split_figures(paths: dict[str, ServedPath], served: str, director: Director, parts: ExportParts,
                       backbone_parameters: int, seed: int) -> SplitFigures:
    """The backbone, the temperature-scaled backbone, DIRECTOR as it would be served (and at S = 1), the post-hoc
    path, the hybrid when ``paths`` holds it, and DIRECTOR minus post-hoc paired on the test split; the ``served``
    path on the reported OOD sets."""
    data, test = parts.data, parts.data.test
    labels = test.labels
    backbone_test = parts.backbone_logits(test)  # [N, C]
    backbone_t = fit_temperature(parts.backbone_logits(data.val), data.val.labels)
    kernel, plain, path = paths["director"], paths["posthoc"], paths[served]
    other = plain if served == "director" else kernel
    s = kernel.default_samples
    tests = {name: p.inputs("test", test, seed) for name, p in paths.items()}
    kernel_test, plain_test = tests["director"], tests["posthoc"]
    s1 = summarize(sample_split(kernel.served, test, 1, seed), temperature_for(kernel.rule, kernel_test.inputs))
    probabilities = {"backbone": backbone_test.softmax(-1),
                     f"backbone + TS (T={backbone_t:.2f})": (backbone_test / backbone_t).softmax(-1),
                     f"DIRECTOR S={s}": kernel_test.summary.probabilities,
                     "post-hoc path": plain_test.summary.probabilities}
    metrics = {
        "served": path.method,
        "director_default_samples": s,
        "backbone": {**metrics_block(probabilities["backbone"], labels), "parameters": backbone_parameters},
        "backbone_temperature_scaled": {**metrics_block((backbone_test / backbone_t).softmax(-1), labels),
                                        "temperature": backbone_t},
        "director_s1": metrics_block(s1.probabilities, labels),
        # DIRECTOR's default S last: at a default of S = 1 this entry is also director_s1
        f"director_s{s}": {**metrics_block(kernel_test.summary.probabilities, labels),
                           "mean_mutual_information": float(kernel_test.summary.mutual_information.mean()),
                           "flagged_rate": flagged_rate(kernel, kernel.ood_score(kernel_test))},
        **{name: {**metrics_block(tests[name].summary.probabilities, labels),
                  "flagged_rate": flagged_rate(p, p.ood_score(tests[name])), "ood_score": p.stats.choice.label,
                  "label_agreement_with_backbone": label_agreement(tests[name].summary.probabilities, backbone_test)}
           for name, p in paths.items() if name != "director"},
        "director_minus_posthoc": paired_bootstrap(kernel_test.summary.probabilities,
                                                   plain_test.summary.probabilities, labels, n_boot=200, seed=seed),
        "ood": reported_ood(path, other, paths, tests, director, parts, seed),
    }
    if "hybrid" in tests:
        probabilities["hybrid"] = tests["hybrid"].summary.probabilities
    return SplitFigures(metrics, probabilities, backbone_t)
