"""A version is never less accurate than its backbone without saying so (docs/your-own-model.md, "DIRECTOR or your
backbone alone"). The kernel's verdict compares DIRECTOR's accuracy with the post-hoc path's (the backbone's own
labels) paired on validation, a loss beyond noise being a material one; the test split's paired accuracy joins the
verdict once the test split is measured, so ``export.method: auto`` serves the post-hoc path where either split shows
DIRECTOR less accurate than its backbone. A version that still serves such a DIRECTOR (``--method director``) carries
the warning on its results page and in the command's last lines, and ``--strict`` refuses to publish it."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from artifact.contract import KernelVerdict, VerdictComparison
from training.config import ExportConfig
from training.export.verdict import as_path_comparison, comparison, decide, path_pair

TEST_SPLIT = "the test split"


class LessAccurateThanBackbone(ValueError):
    """``--strict``: the version would serve a DIRECTOR less accurate than its backbone; nothing was published."""


def accuracy_on_test_split(metrics: dict[str, Any]) -> VerdictComparison:
    """DIRECTOR's test accuracy against the post-hoc path's (the backbone's labels), with the paired bootstrap interval
    of their difference that the test figures (``training.export.figures``) record."""
    director = metrics[f"director_s{metrics['director_default_samples']}"]["accuracy"]
    paired = metrics["director_minus_posthoc"]["accuracy"]
    return comparison(TEST_SPLIT, "accuracy", director, metrics["posthoc"]["accuracy"], tuple(paired["ci95"]),
                      margin=0.0)


def with_test_split(verdict: KernelVerdict, metrics: dict[str, Any], ecfg: ExportConfig) -> KernelVerdict:
    """The verdict decided again with the test split's accuracy among its comparisons, DIRECTOR's against the post-hoc
    path and against the hybrid (whose labels are the post-hoc path's): a loss there can only turn ``auto`` away from
    DIRECTOR (a gain in accuracy counts for nothing)."""
    accuracy = accuracy_on_test_split(metrics)
    pairs = [path_pair(p.richer, p.cheaper, [*p.comparisons, as_path_comparison(accuracy)]) if p.richer == "director"
             else p for p in verdict.pairs]
    return decide([*verdict.comparisons, accuracy], verdict.requested, ecfg, verdict.cost, pairs)


def accuracy_losses(verdict: KernelVerdict | None) -> list[VerdictComparison]:
    """The splits on which a served DIRECTOR is less accurate than its backbone beyond noise (none when the version
    serves the post-hoc path or the hybrid: they predict what the backbone predicts)."""
    if verdict is None or verdict.served != "director":
        return []
    return [c for c in verdict.comparisons if c.metric == "accuracy" and c.material_loss]


def backbone_warning(verdict: KernelVerdict | None) -> str | None:
    """What the results page and the command say of a version less accurate than its backbone, else None."""
    losses = accuracy_losses(verdict)
    if not losses:
        return None
    said = "; ".join(f"on {c.set} {100 * c.director:.2f}% against "
                     f"{100 * c.posthoc:.2f}% ({100 * c.difference:+.2f} points, 95% interval "
                     f"[{100 * c.ci95[0]:+.2f}, {100 * c.ci95[1]:+.2f}])" for c in losses)
    return (f"this version serves DIRECTOR, which is less accurate than its backbone beyond noise: {said}. "
            "--method auto serves the backbone's own forward with the same post-hoc tools instead; --strict refuses "
            "to publish such a version")


def refuse_unless_as_accurate(verdict: KernelVerdict, tmp_dir: Path, out_dir: Path) -> None:
    """``strict``: a version serving a DIRECTOR less accurate than its backbone is not published; its staged files go,
    and so does its model's folder when nothing else is in it."""
    warning = backbone_warning(verdict)
    if warning is None:
        return
    shutil.rmtree(tmp_dir, ignore_errors=True)
    if out_dir.parent.is_dir() and not any(out_dir.parent.iterdir()):
        out_dir.parent.rmdir()
    raise LessAccurateThanBackbone(f"--strict: {warning}; nothing was published ({out_dir} was not written)")
