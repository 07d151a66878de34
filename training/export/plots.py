"""Matplotlib figures for the results pages (PNG, headless)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from training.metrics import ECE_BINS  # noqa: E402


def reliability_diagram(named_probs: dict[str, torch.Tensor], labels: torch.Tensor, path: Path,
                        n_bins: int = ECE_BINS) -> Path:
    """Accuracy against confidence in equal-width bins, one line per method, with bin counts below."""
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(6, 6.5), height_ratios=[3, 1], sharex=True)
    edges = torch.linspace(0, 1, n_bins + 1)
    centres = (edges[:-1] + edges[1:]) / 2
    top.plot([0, 1], [0, 1], color="grey", linestyle="--", linewidth=1, label="perfect calibration")
    width = 1.0 / n_bins / (len(named_probs) + 1)
    for i, (name, probs) in enumerate(named_probs.items()):
        confidence, prediction = probs.max(-1)
        correct = (prediction == labels).float()
        bins = torch.bucketize(confidence, edges[1:-1])
        counts = torch.bincount(bins, minlength=n_bins).float()
        accuracy = torch.bincount(bins, weights=correct, minlength=n_bins) / counts.clamp_min(1)
        mask = counts > 0
        top.plot(centres[mask].numpy(), accuracy[mask].numpy(), marker="o", markersize=3, label=name)
        bottom.bar((edges[:-1] + i * width).numpy(), (counts / counts.sum()).numpy(), width=width, align="edge",
                   label=name)
    top.set_ylabel("accuracy")
    top.set_title("Reliability (15 equal-width bins, top label)")
    top.legend(loc="upper left", fontsize=8)
    bottom.set_xlabel("confidence")
    bottom.set_ylabel("fraction")
    bottom.set_yscale("log")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
