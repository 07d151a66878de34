"""The evaluation page's section on DIRECTOR's own contribution (``training.evaluate.kernel_depth``): the kernel error
over K diffused steps, alone and combined with the best feature score, against that feature score alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from training.evaluate.plots import kernel_depth_plot


def cell(report: dict[str, Any]) -> str:
    return f"{report['auroc']:.3f} / {report['fpr95']:.3f}"


def interval(diff: dict[str, Any]) -> str:
    low, high = diff["ci95"]
    return f"{diff['difference']:+.3f} [{low:+.3f}, {high:+.3f}]"


def depth_rows(kd: dict[str, Any]) -> list[str]:
    """One table row per K, plus the feature score's row: OOD-validation AUROC, then AUROC / FPR95 per reported set."""
    depths = kd["depths"]
    first = next(iter(depths.values()))
    sets = list(first["ood"])
    lines = ["| score | K | epochs | extra layers per input (teacher / kernel) | OOD-validation AUROC | "
             + " | ".join(sets) + " |", "| --- | --- | --- | --- | --- | " + " | ".join("---" for _ in sets) + " |",
             f"| {first['feature_score']} alone | - | - | - | {first['validation_auroc']['feature']:.3f} | "
             + " | ".join(cell(first["ood"][s]["feature"]) for s in sets) + " |"]
    for depth, e in depths.items():
        extra = f"{e['cost']['teacher_layers']} / {e['cost']['extra_kernel_steps']}"
        for key, name in (("kernel_error", "kernel error"), ("combined", f"`{e['combined_score']}`")):
            lines.append(f"| {name} | {depth} | {e['epochs']} | {extra} | {e['validation_auroc'][key]:.3f} | "
                         + " | ".join(cell(e["ood"][s][key]) for s in sets) + " |")
    return lines


def kernel_depth_section(results: dict[str, Any], out_dir: Path) -> list[str]:
    """The section's lines (and its plot, written beside the page) for a results record with the stage."""
    kd = results["kernel_depth"]
    depths, first = kd["depths"], next(iter(kd["depths"].values()))
    sets = list(first["ood"])
    plot = kernel_depth_plot(kd, out_dir / f"{results['task']}-kernel-depth.png")
    lines = [f"The kernel error averages the kernel's teacher-forced squared error over the last K of the backbone's "
             f"{kd['transitions']} transitions. The run's own kernel diffuses K = {kd['served_depth']} "
             f"(distilled for {depths[str(kd['served_depth'])]['epochs']} epoch(s)); each other K is distilled on "
             f"the same frozen backbone for {results['settings']['kernel_depth_epochs']} epoch(s) (tau selected "
             "again for it). The feature score (the best of MDS, RMDS, KNN and ViM, none of which depends on K) and "
             "the combination (the exporter's standardised sum of the kernel error with a feature score, pair and "
             "weight) are chosen on the OOD-validation set only. Cells: AUROC / FPR at 95% TPR, test split against "
             "the set. Extra layers: the backbone layers the kernel error runs per input (which the feature score "
             "needs as well) and the teacher-forced kernel steps beyond the sampled path's first."
             + "".join(f" K = {k} is skipped: {why}." for k, why in kd["skipped"].items()), "", *depth_rows(kd), "",
             f"Combination minus {first['feature_score']} alone, AUROC, with a 95% interval from "
             f"{results['settings']['bootstrap']} paired resamples of the test and OOD inputs:", "",
             "| K | " + " | ".join(sets) + " |", "| --- | " + " | ".join("---" for _ in sets) + " |"]
    lines += [f"| {depth} | " + " | ".join(interval(e["ood"][s]["combined_minus_feature"]) for s in sets) + " |"
              for depth, e in depths.items()]
    return lines + ["", *verdict(results), "", f"![kernel-depth]({plot.name})"]


def verdict(results: dict[str, Any]) -> list[str]:
    """Which variant wins on OOD validation, against the served score (and its own OOD-validation AUROC among every
    candidate of ``test_and_ood``), and what each K costs."""
    kd, win = results["kernel_depth"], results["kernel_depth"]["winner"]
    served = kd["served_score"]
    served_auroc = results["test_and_ood"]["director_s1"]["ood_selection_auroc"].get(served)
    cost = {d: e["cost"] for d, e in kd["depths"].items()}
    return [f"On OOD validation the winner among these variants is `{win['label']}` (AUROC "
            f"{win['validation_auroc']:.4f}); the served score (DIRECTOR's S = 1 choice among every candidate, logit "
            f"scores included) is `{served}`"
            + (f" (AUROC {served_auroc:.4f})" if served_auroc is not None else "") + ": "
            + ("the winner differs from it." if win["differs_from_served"] else "the same.")
            + " Cost at S = 1 in layer-equivalents (a kernel step counted as one layer; the embedding and readout not "
            f"counted), against the backbone's {kd['transitions']}: "
            + "; ".join(f"K={d} {c['layer_equivalents_s1']} ({c['ratio_to_backbone']:.2f}x)" for d, c in cost.items())
            + "."]
