"""What the kernel adds on the evaluation's own sets: DIRECTOR minus the post-hoc path, paired per input
(docs/method.md, "The kernel earns its place, or steps aside").

The export's verdict compares the two paths on validation, its held-out shift and the OOD-validation families; this
ablation repeats the comparison on what the export never saw: the test split (accuracy, ECE, NLL), every reported OOD
set (AUROC and FPR95 of each path's own chosen score, the same bootstrap resample of the test split and of the set for
both paths) and every shift level (pooled as the shift stage pools them). The post-hoc path here has its tools fitted
by the export's rules (``training.evaluate.evaluation.backbone_path_method``); the DIRECTOR rows are S = 1 and the
version as served (else the evaluation's default S).
"""

from __future__ import annotations

from typing import Any

from training.evaluate.evaluation import POSTHOC, Evaluation, Method
from training.ood_metrics import auroc, fpr_at_tpr, paired_ood_interval


def ablated_methods(methods: list[Method], samples: int) -> list[Method]:
    """The DIRECTOR rows the ablation shows: S = 1, and the served version's row, else the default S."""
    keys = [m.key for m in methods]
    second = "director_served" if "director_served" in keys else f"director_s{samples}"
    return [m for m in methods if m.key in ("director_s1", second)]


def ood_differences(evaluation: Evaluation, director: str, n_boot: int, seed: int) -> dict[str, Any]:
    """Per reported OOD set, AUROC and FPR95 of ``director``'s own score minus the post-hoc path's, with paired 95%
    intervals."""
    mine, theirs = evaluation.chosen_scores[director], evaluation.chosen_scores[POSTHOC]
    out: dict[str, Any] = {}
    for offset, set_name in enumerate(s for s in mine if s != "test"):
        out[set_name] = {}
        for metric, fn in (("auroc", auroc), ("fpr95", fpr_at_tpr)):
            ci = paired_ood_interval(fn, mine["test"], mine[set_name], theirs["test"], theirs[set_name], n_boot,
                                     seed + offset)
            out[set_name][metric] = {"director": fn(mine["test"], mine[set_name]),
                                     "posthoc": fn(theirs["test"], theirs[set_name]),
                                     "difference": fn(mine["test"], mine[set_name])
                                     - fn(theirs["test"], theirs[set_name]), "ci95": list(ci)}
    return out


def kernel_ablation(evaluation: Evaluation, methods: list[Method], results: dict[str, Any]) -> dict[str, Any]:
    """DIRECTOR minus the post-hoc path for each ablated DIRECTOR row: ``test`` (from the paired table), ``ood`` (per
    reported set) and ``shift`` (per level, when the shift stage ran); {} when the evaluation has no post-hoc row."""
    if POSTHOC not in evaluation.chosen_scores:
        return {}
    ev, seed = evaluation.ev, evaluation.cfg.seed
    rows: dict[str, Any] = {}
    for method in ablated_methods(methods, ev.samples):
        shift = results.get("shift", {}).get(method.key, {})
        rows[method.key] = {"label": method.label, "test": results["paired"][f"{method.key} - {POSTHOC}"],
                            "ood": ood_differences(evaluation, method.key, ev.bootstrap, seed),
                            "shift": shift.get("paired_vs_posthoc", {})}
    return {"posthoc": {"key": POSTHOC, "label": next(m.label for m in methods if m.key == POSTHOC),
                        **evaluation.posthoc_fit}, "rows": rows}
