"""The manifest's ``kernel_verdict`` section (format 1.5): what the DIRECTOR kernel adds on a model, measured at export
against the post-hoc path with the same post-hoc tools, and which of the two the version serves (docs/method.md, "The
kernel earns its place, or steps aside")."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from artifact.section import Section


class VerdictComparison(Section):
    """One paired comparison of DIRECTOR as served against the post-hoc path: ``difference`` is DIRECTOR minus
    post-hoc (lower is better for NLL, ECE and FPR95, higher for AUROC), with its 95% interval."""

    set: str
    metric: str
    director: float
    posthoc: float
    difference: float
    ci95: tuple[float, float]
    favours: Literal["director", "posthoc", "neither"]  # beyond noise: the interval excludes 0
    margin: float | None = None  # the practical size of a difference in this measure (absolute)
    counts_for_kernel: bool = False  # a practical gain on this measure can earn the kernel its place
    practical: bool = False  # DIRECTOR's gain is beyond noise and beyond the margin, on a measure that counts for it
    material_loss: bool = False  # DIRECTOR is worse beyond noise and beyond the margin: the post-hoc path is served


class KernelVerdict(Section):
    """What the DIRECTOR kernel adds on this model, measured at export (1.5): paired per input against the post-hoc
    path with the same post-hoc tools, and which of the two ``export.method`` serves."""

    requested: Literal["auto", "director", "posthoc"]
    served: Literal["director", "posthoc"]
    # DIRECTOR gains beyond noise and a practical margin somewhere, and loses beyond noise and the margin nowhere
    kernel_wins: bool
    sentence: str  # the verdict in one sentence, as GET /models and the model page show it
    comparisons: list[VerdictComparison] = Field(default_factory=list)
    margins: dict[str, float] = Field(default_factory=dict)
    cost: dict[str, Any] | None = None  # what each path computes per input
