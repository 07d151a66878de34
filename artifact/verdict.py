"""The manifest's ``kernel_verdict`` section (format 1.5): what the DIRECTOR kernel adds on a model, measured at export
against the post-hoc path with the same post-hoc tools, and which path the version serves (docs/method.md, "The
kernel earns its place, or steps aside"). Since 1.9 three paths are weighed: DIRECTOR, the hybrid (the backbone's own
forward with the kernel's error beside it) and the post-hoc path; ``pairs`` holds the two further comparisons, each
a richer path against a cheaper one ("The kernel's signal beside the exact backbone")."""

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


PathName = Literal["director", "hybrid", "posthoc"]


class PathComparison(Section):
    """One paired comparison of a ``richer`` path against a ``cheaper`` one (1.9): ``difference`` is richer minus
    cheaper, read as ``VerdictComparison``'s with the two paths in place of DIRECTOR and the post-hoc path."""

    set: str
    metric: str
    richer: float
    cheaper: float
    difference: float
    ci95: tuple[float, float]
    favours: Literal["richer", "cheaper", "neither"]
    margin: float | None = None
    counts_for_richer: bool = False  # a practical gain on this measure can earn the richer path its place
    practical: bool = False
    material_loss: bool = False


class PathPair(Section):
    """Whether the ``richer`` path earns its extra compute over the ``cheaper`` one (1.9): a practical gain somewhere
    and a material loss nowhere, by the rule of ``KernelVerdict``."""

    richer: PathName
    cheaper: PathName
    earns: bool
    sentence: str
    comparisons: list[PathComparison] = Field(default_factory=list)


class KernelVerdict(Section):
    """What the DIRECTOR kernel adds on this model, measured at export (1.5): paired per input against the post-hoc
    path with the same post-hoc tools, and which path ``export.method`` serves. ``comparisons`` are DIRECTOR minus the
    post-hoc path; ``pairs`` (1.9) the hybrid against the post-hoc path and DIRECTOR against the hybrid."""

    requested: Literal["auto", "director", "hybrid", "posthoc"]
    served: PathName
    # DIRECTOR gains beyond noise and a practical margin somewhere, and loses beyond noise and the margin nowhere
    kernel_wins: bool
    sentence: str  # the verdict in one sentence, as GET /models and the model page show it
    comparisons: list[VerdictComparison] = Field(default_factory=list)
    margins: dict[str, float] = Field(default_factory=dict)
    cost: dict[str, Any] | None = None  # what each path computes per input
    pairs: list[PathPair] = Field(default_factory=list)

    def pair(self, richer: str, cheaper: str) -> PathPair | None:
        return next((p for p in self.pairs if p.richer == richer and p.cheaper == cheaper), None)
