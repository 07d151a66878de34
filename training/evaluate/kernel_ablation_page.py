"""The page section of ``training.evaluate.kernel_ablation``: DIRECTOR minus the post-hoc path, paired, with a sentence
per DIRECTOR row computed from the intervals (what is beyond noise either way)."""

from __future__ import annotations

from typing import Any

LOWER_IS_BETTER = {"accuracy": False, "ece": True, "nll": True, "auroc": False, "fpr95": True}
POINTS = {"accuracy", "ece", "fpr95"}  # shown in points (x 100)


def shown(metric: str, d: dict[str, Any]) -> str:
    """``difference [low, high]`` in the metric's unit."""
    scale, digits = (100.0, 2) if metric in POINTS else (1.0, 3 if metric == "auroc" else 4)
    low, high = d["ci95"]
    return f"{scale * d['difference']:+.{digits}f} [{scale * low:+.{digits}f}, {scale * high:+.{digits}f}]"


def side(metric: str, d: dict[str, Any]) -> str | None:
    """"for" DIRECTOR, "against" it, or None when the interval holds 0."""
    low, high = d["ci95"]
    if low <= 0 <= high:
        return None
    better = (high < 0) == LOWER_IS_BETTER[metric]
    return "for" if better else "against"


def level_name(level: str, modality: str) -> str:
    return "shifted domains, pooled" if level == "mean" else f"corruption severity {level}" if modality == "image" \
        else level


def row_sentence(label: str, row: dict[str, Any], modality: str) -> str:
    """Which differences are beyond noise for DIRECTOR and against it."""
    found: dict[str, list[str]] = {"for": [], "against": []}
    cells = [("test", m, row["test"][m]) for m in ("accuracy", "ece", "nll")]
    cells += [(level_name(level, modality), m, d[m]) for level, d in row["shift"].items() for m in ("ece", "nll")]
    cells += [(name, m, d[m]) for name, d in row["ood"].items() for m in ("auroc", "fpr95")]
    for where, metric, d in cells:
        way = side(metric, d)
        if way is not None:
            found[way].append(f"{metric.upper() if metric != 'accuracy' else metric} on {where} {shown(metric, d)}")
    gains = "; ".join(found["for"]) or "nothing"
    losses = "; ".join(found["against"]) or "nothing"
    return (f"- {label}: better than the post-hoc path beyond noise on {gains}; worse beyond noise on {losses}; "
            f"the other {len(cells) - len(found['for']) - len(found['against'])} of {len(cells)} differences are "
            "within noise.")


def kernel_ablation_section(results: dict[str, Any]) -> list[str]:
    """What the kernel adds over the post-hoc path on the test split, the shift levels and the reported OOD sets."""
    ablation = results.get("kernel_ablation")
    if not ablation:
        return []
    posthoc, rows = ablation["posthoc"], ablation["rows"]
    modality = results.get("modality", "image")
    lines = ["## What the kernel adds: DIRECTOR minus the post-hoc path, paired", "",
             f"The post-hoc path ({posthoc['label']}) is the backbone's own forward with the tools an export fits: "
             "the temperature, a temperature per input that follows its OOD score when that wins on the held-out "
             f"shift, and its own OOD score chosen by the same rule over the same families ({posthoc['ood_score']}). "
             "Each cell is DIRECTOR minus the post-hoc path on the same inputs with a 95% paired bootstrap interval "
             f"({results['settings']['bootstrap']} resamples); the shift levels pool their inputs as the shift "
             "section does, and each OOD cell resamples the test split and the set for both paths alike. An "
             "interval that excludes 0 is a difference these inputs can see; whether it matters is the export's "
             "verdict with its margins (docs/method.md, \"The kernel earns its place, or steps aside\").", "",
             "| DIRECTOR row | inputs | accuracy (points) | ECE (points) | NLL |", "| --- | --- | --- | --- | --- |"]
    for row in rows.values():
        levels = [("test split", row["test"])] + [(level_name(k, modality), v) for k, v in row["shift"].items()]
        lines += [f"| {row['label']} | {name} | " + " | ".join(shown(m, d[m]) for m in ("accuracy", "ece", "nll"))
                  + " |" for name, d in levels]
    lines += ["", "| DIRECTOR row | OOD set | AUROC DIRECTOR / post-hoc | AUROC difference "
                  "| FPR95 difference (points) |", "| --- | --- | --- | --- | --- |"]
    for row in rows.values():
        lines += [f"| {row['label']} | {name} | {d['auroc']['director']:.3f} / {d['auroc']['posthoc']:.3f} | "
                  f"{shown('auroc', d['auroc'])} | {shown('fpr95', d['fpr95'])} |" for name, d in row["ood"].items()]
    lines += ["", *(row_sentence(row["label"], row, modality) for row in rows.values()), ""]
    return lines
