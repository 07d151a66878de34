"""Figures of the evaluation page: reliability per method, risk against coverage, accuracy/ECE against shift
severity, and ECE against latency over sample counts."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from training.metrics import ECE_BINS  # noqa: E402


def _save(fig: Any, path: Path, rect: tuple[float, float, float, float] = (0, 0, 1, 1)) -> Path:
    fig.tight_layout(rect=rect)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def reliability_grid(named_probs: dict[str, torch.Tensor], labels: torch.Tensor, path: Path,
                     n_bins: int = ECE_BINS) -> Path:
    """One reliability diagram per method (accuracy per equal-width confidence bin, bar width = bin)."""
    cols = min(4, len(named_probs))
    rows = math.ceil(len(named_probs) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 3.2 * rows), squeeze=False, sharex=True, sharey=True)
    edges = torch.linspace(0, 1, n_bins + 1)
    for ax, (name, probs) in zip(axes.flat, named_probs.items(), strict=False):
        confidence, prediction = probs.max(-1)
        correct = (prediction == labels).float()
        bins = torch.bucketize(confidence, edges[1:-1])
        counts = torch.bincount(bins, minlength=n_bins).float()
        accuracy = torch.bincount(bins, weights=correct, minlength=n_bins) / counts.clamp_min(1)
        mean_conf = torch.bincount(bins, weights=confidence, minlength=n_bins) / counts.clamp_min(1)
        mask = counts > 0
        ax.bar(edges[:-1][mask].numpy(), accuracy[mask].numpy(), width=1 / n_bins, align="edge",
               edgecolor="black", linewidth=0.4, label="accuracy")
        ax.bar(edges[:-1][mask].numpy(), (mean_conf - accuracy)[mask].numpy(), bottom=accuracy[mask].numpy(),
               width=1 / n_bins, align="edge", color="tab:red", alpha=0.35, label="gap")
        ax.plot([0, 1], [0, 1], color="grey", linestyle="--", linewidth=1)
        ax.set_title(name, fontsize=8)
    for ax in axes.flat[len(named_probs):]:
        ax.axis("off")
    for ax in axes[-1]:
        ax.set_xlabel("confidence")
    for ax in axes[:, 0]:
        ax.set_ylabel("accuracy")
    fig.suptitle(f"Reliability on the test split ({n_bins} equal-width bins, top label)", fontsize=10)
    return _save(fig, path)


def shift_plot(shift: dict[str, Any], labels: dict[str, str], path: Path) -> Path:
    """Accuracy and ECE against corruption severity (mean over corruption types), one line per method."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for key, result in shift.items():
        severities = sorted(result["by_severity"], key=int)
        x = [int(s) for s in severities]
        left.plot(x, [100 * result["by_severity"][s]["accuracy"] for s in severities], marker="o", label=labels[key])
        right.plot(x, [100 * result["by_severity"][s]["ece"] for s in severities], marker="o", label=labels[key])
    left.set(xlabel="severity", ylabel="accuracy (%)", title="Accuracy under corruption")
    right.set(xlabel="severity", ylabel="ECE (%)", title="ECE under corruption")
    right.legend(fontsize=7)
    return _save(fig, path)


def domain_shift_plot(shift: dict[str, Any], labels: dict[str, str], path: Path) -> Path:
    """Accuracy and ECE per shifted text domain (the in-domain test split is in the main table), grouped bars."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.8))
    keys = list(shift)
    domains = list(next(iter(shift.values()))["by_domain"])
    width = 0.8 / len(keys)
    for i, key in enumerate(keys):
        x = [d + (i - (len(keys) - 1) / 2) * width for d in range(len(domains))]
        left.bar(x, [100 * shift[key]["by_domain"][d]["accuracy"] for d in domains], width, label=labels[key])
        right.bar(x, [100 * shift[key]["by_domain"][d]["ece"] for d in domains], width, label=labels[key])
    for ax, ylabel, title in ((left, "accuracy (%)", "Accuracy per domain"), (right, "ECE (%)", "ECE per domain")):
        ax.set_xticks(range(len(domains)), domains)
        ax.set(ylabel=ylabel, title=title)
    handles, names = left.get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=4, fontsize=7, frameon=False)
    return _save(fig, path, rect=(0, 0.12, 1, 1))  # room for the legend below the axes


def sweep_plot(sweep: dict[str, Any], path: Path) -> Path:
    """ECE against latency per input, one point per sample count."""
    fig, ax = plt.subplots(figsize=(6, 4))
    names = {"director": "DIRECTOR", "mc_dropout": "MC dropout"}
    for source, rows in sweep.items():
        counts = sorted(rows, key=int)
        xs = [rows[s]["latency_ms"] for s in counts]
        ys = [100 * rows[s]["ece"] for s in counts]
        ax.plot(xs, ys, marker="o", label=names.get(source, source))
        for s, x, y in zip(counts, xs, ys, strict=True):
            ax.annotate(f"S={s}", (x, y), textcoords="offset points", xytext=(3, 3), fontsize=7)
    ax.set(xscale="log", xlabel="latency per input (ms, batch of one, log scale)", ylabel="ECE (%)",
           title="ECE against latency over sample counts")
    ax.legend()
    return _save(fig, path)


def risk_coverage_plot(named_probs: dict[str, torch.Tensor], labels: torch.Tensor, path: Path) -> Path:
    """Selective risk (the error rate of the inputs kept) against coverage (the share kept) when inputs are kept in
    order of confidence, one line per method: a user reads off the confidence threshold that meets the error rate
    they accept."""
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for name, probs in named_probs.items():
        confidence, prediction = probs.max(-1)  # [N] each
        errors = (prediction != labels)[confidence.argsort(descending=True)].double()  # [N] most confident first
        kept = torch.arange(1, len(errors) + 1, dtype=torch.float64)  # [N]
        ax.plot((kept / len(errors)).numpy(), (100 * errors.cumsum(0) / kept).numpy(), linewidth=1.2, label=name)
    ax.set(xlabel="coverage (share of inputs kept, most confident first)", ylabel="error rate of the kept inputs (%)",
           title="Risk against coverage on the test split")
    ax.legend(fontsize=7)
    return _save(fig, path)


def kernel_depth_plot(kernel_depth: dict[str, Any], path: Path) -> Path:
    """AUROC per set (OOD validation, where the choices are made, then the reported sets) of the feature score alone
    and, per K, the kernel error alone and combined with the feature score: grouped bars."""
    depths = kernel_depth["depths"]
    first = next(iter(depths.values()))
    sets = ["OOD validation", *first["ood"]]
    bars = {f"{first['feature_score']} alone": [first["validation_auroc"]["feature"],
                                                *(first["ood"][s]["feature"]["auroc"] for s in first["ood"])]}
    for depth, entry in depths.items():
        for key, name in (("kernel_error", "kernel error"), ("combined", "combined")):
            bars[f"{name} K={depth}"] = [entry["validation_auroc"][key],
                                         *(entry["ood"][s][key]["auroc"] for s in entry["ood"])]
    fig, ax = plt.subplots(figsize=(9, 4.2))
    width = 0.8 / len(bars)
    for i, (name, values) in enumerate(bars.items()):
        ax.bar([x + (i - (len(bars) - 1) / 2) * width for x in range(len(sets))], values, width, label=name)
    lowest = min(min(values) for values in bars.values())
    ax.set_xticks(range(len(sets)), sets)
    ax.set(ylabel="AUROC", ylim=(max(0.0, lowest - 0.05), 1.0),
           title="The kernel error over K steps, alone and with the feature score")
    handles, names = ax.get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=len(bars), fontsize=7, frameon=False)
    return _save(fig, path, rect=(0, 0.07, 1, 1))  # room for the legend below the axes


def decisions_plot(section: dict[str, Any], path: Path) -> Path:
    """Left: the test split's error rate among answered inputs against the share answered, each method's guaranteed
    thresholds marked. Right: coverage at the 90% target per shift level, plain (solid) and shift-normalised
    (dashed)."""
    fig, (risk_ax, shift_ax) = plt.subplots(1, 2, figsize=(11, 4.2))
    score = section["default_score"]
    for i, entry in enumerate(section["methods"].values()):
        colour = f"C{i}"
        curve = entry["test"]["curve"]
        risk_ax.plot(curve["answered"], [100 * r for r in curve["risk"]], color=colour, linewidth=1.2,
                     label=entry["label"])
        marks = [f for f in entry["test"]["selective"].values() if f["risk"] is not None]
        risk_ax.scatter([f["answered"] for f in marks], [100 * f["risk"] for f in marks], color=colour, marker="o",
                        s=18)
        levels = list(entry["shift"])
        for key, style in (("sets", "-"), ("sets_normalised", "--")):
            shift_ax.plot(levels, [100 * entry["shift"][level][key]["0.9"]["coverage"] for level in levels],
                          color=colour, linestyle=style, marker=".", label=entry["label"] if key == "sets" else None)
    for risk in section["risks"]:
        risk_ax.axhline(100 * risk, color="grey", linewidth=0.6, linestyle=":")
    shift_ax.axhline(90, color="grey", linewidth=0.8, linestyle=":")
    risk_ax.set(xlabel="share answered (most confident first)", ylabel="error rate of answered inputs (%)",
                title="Abstentions: guaranteed thresholds (dots), max_risk (dotted)")
    shift_ax.set(xlabel="shift level", ylabel=f"coverage at the 90% target (%, {score})",
                 title="Coverage under shift: plain (solid), normalised (dashed)")
    shift_ax.tick_params(axis="x", labelrotation=30)
    risk_ax.legend(fontsize=7)
    return _save(fig, path)
