"""The kernel's verdict (docs/method.md, "The kernel earns its place, or steps aside"): DIRECTOR as it would be served
against the post-hoc path with the same post-hoc tools, paired per input, and which of the two a version serves.

Each path comes with its own served temperature rule and its own OOD score, chosen by the same rules on the same
validation data. They are compared on validation and on the held-out shift (NLL and ECE of the served probabilities;
on validation also the accuracy, whose practical size is 0) and on every OOD-validation family (AUROC and FPR95 of the
served score against validation, and the AUROC of the worst family). Each comparison is DIRECTOR minus post-hoc with a
95% interval: the paired per-input mean and its standard error for the NLL and the accuracy, a paired bootstrap (the
same resample for both paths) for the others.

Every measure has a practical size (``verdict_ece`` and ``verdict_auroc`` absolute, ``verdict_nll_relative`` of the
post-hoc path's NLL, ``verdict_fpr95`` absolute). ``export.method: auto`` serves DIRECTOR only when it gains beyond
noise *and* beyond that size on at least one of: ECE on the held-out shift, NLL on validation or on the shift, the worst
family's AUROC; and is worse beyond noise *and* beyond that size on none of the comparisons. A difference inside the
size is practically equivalent whichever way it points: with a few thousand inputs an interval excludes 0 for
differences nobody would act on, and such a difference neither earns the kernel its place nor vetoes a real gain.
Otherwise it serves the post-hoc path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from artifact.contract import KernelVerdict, VerdictComparison
from artifact.verdict import PathComparison, PathPair
from training.config import ExportConfig, PipelineConfig
from training.data.held_out_shift import HeldOutShift
from training.metrics import ece, paired_bootstrap
from training.ood_metrics import auroc, fpr_at_tpr, paired_ood_interval
from training.posthoc.modality_parts import ExportParts
from training.posthoc.ood_selection import ScoreInputs
from training.posthoc.served_path import ServedPath
from training.posthoc.served_statistics import paired_difference

LOWER_IS_BETTER = {"nll": True, "ece": True, "fpr95": True, "auroc": False, "worst_auroc": False, "accuracy": False}


@dataclass(frozen=True)
class PathFigures:
    """What one path serves on the verdict's sets: the served probabilities and OOD score on validation and on the
    held-out shift, and the served OOD score on each OOD-validation family."""

    val: ScoreInputs
    val_score: torch.Tensor  # [N] the served OOD score
    shift: ScoreInputs
    family_scores: dict[str, torch.Tensor]  # family -> [M] the served OOD score


class ServedScores(Protocol):
    """A path's served OOD score on validation [N] and on each OOD-validation family [M]: what the OOD comparisons
    read (``PathFigures`` here, a multi-label path's figures in ``training.export.label_verdict``)."""

    @property
    def val_score(self) -> torch.Tensor: ...

    @property
    def family_scores(self) -> dict[str, torch.Tensor]: ...


def favours(difference_ci: tuple[float, float], lower_is_better: bool) -> str:
    """Which path a DIRECTOR-minus-post-hoc interval favours beyond noise (it excludes 0), else "neither"."""
    low, high = difference_ci
    if high < 0:
        return "director" if lower_is_better else "posthoc"
    if low > 0:
        return "posthoc" if lower_is_better else "director"
    return "neither"


def comparison(set_name: str, metric: str, director: float, posthoc: float, ci: tuple[float, float],
               margin: float, counts_for_kernel: bool = False) -> VerdictComparison:
    """One comparison. ``practical``: DIRECTOR's gain is beyond noise and at least ``margin`` (absolute) on a measure
    that ``counts_for_kernel``; ``material_loss``: its loss is beyond noise and at least ``margin``."""
    lower = LOWER_IS_BETTER[metric]
    side = favours(ci, lower)
    difference = director - posthoc
    gain = -difference if lower else difference
    return VerdictComparison(set=set_name, metric=metric, director=director, posthoc=posthoc, difference=difference,
                             ci95=ci, favours=side, margin=margin, counts_for_kernel=counts_for_kernel,
                             practical=counts_for_kernel and side == "director" and gain >= margin,
                             material_loss=side == "posthoc" and -gain >= margin)


def label_nll(probs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """-log p(label) of every input [N] (probs [N, C])."""
    return -probs.gather(1, labels[:, None]).squeeze(1).clamp_min(1e-12).log()  # [N]


def calibration_comparisons(set_name: str, director: ScoreInputs, posthoc: ScoreInputs, labels: torch.Tensor,
                            ecfg: ExportConfig, seed: int, shift: bool) -> list[VerdictComparison]:
    """NLL (paired per input) and ECE (paired bootstrap) of the two paths' served probabilities on one labelled set;
    an ECE gain counts for the kernel on the held-out ``shift`` only."""
    p_dir, p_post = director.summary.probabilities, posthoc.summary.probabilities  # [N, C] each
    nll_dir, nll_post = label_nll(p_dir, labels), label_nll(p_post, labels)  # [N] each
    mean, stderr = paired_difference(nll_dir - nll_post)
    mean_post = float(nll_post.mean())
    nll = comparison(set_name, "nll", float(nll_dir.mean()), mean_post, (mean - 1.96 * stderr, mean + 1.96 * stderr),
                     margin=ecfg.verdict_nll_relative * mean_post, counts_for_kernel=True)
    ece_ci = paired_bootstrap(p_dir, p_post, labels, ecfg.verdict_bootstrap, seed)["ece"]["ci95"]
    calibration = comparison(set_name, "ece", ece(p_dir, labels), ece(p_post, labels), tuple(ece_ci),
                             margin=ecfg.verdict_ece, counts_for_kernel=shift)
    return [nll, calibration]


def accuracy_comparison(set_name: str, director: ScoreInputs, posthoc: ScoreInputs, labels: torch.Tensor
                        ) -> VerdictComparison:
    """Accuracy, paired per input: the post-hoc path predicts the backbone's own labels (its temperatures rescale the
    backbone's logits), so this is DIRECTOR against its backbone. Its margin is 0: a DIRECTOR less accurate than its
    backbone beyond noise is never served by ``auto`` (docs/your-own-model.md)."""
    right_dir = (director.summary.probabilities.argmax(-1) == labels).double()  # [N]
    right_post = (posthoc.summary.probabilities.argmax(-1) == labels).double()  # [N]
    mean, stderr = paired_difference(right_dir - right_post)
    return comparison(set_name, "accuracy", float(right_dir.mean()), float(right_post.mean()),
                      (mean - 1.96 * stderr, mean + 1.96 * stderr), margin=0.0)


def ood_comparisons(director: ServedScores, posthoc: ServedScores, descriptions: dict[str, str], ecfg: ExportConfig,
                    seed: int) -> list[VerdictComparison]:
    """AUROC and FPR95 of each path's served score, validation against each OOD-validation family, and the AUROC of
    the worst family (the resample of validation shared by every family)."""
    out = []
    val_dir, val_post = director.val_score, posthoc.val_score  # [N]
    n_id = val_dir.shape[0]
    for offset, family in enumerate(director.family_scores):
        ood_dir, ood_post = director.family_scores[family], posthoc.family_scores[family]  # [M]
        for metric, fn, margin in (("auroc", auroc, ecfg.verdict_auroc), ("fpr95", fpr_at_tpr, ecfg.verdict_fpr95)):
            ci = paired_ood_interval(fn, val_dir, ood_dir, val_post, ood_post, ecfg.verdict_bootstrap, seed + offset)
            out.append(comparison(descriptions.get(family, family), metric, fn(val_dir, ood_dir),
                                  fn(val_post, ood_post), ci, margin))
    families = list(director.family_scores)

    def worst(scores_id: torch.Tensor, by_family: dict[str, torch.Tensor], i: torch.Tensor | None = None,
              js: dict[str, torch.Tensor] | None = None) -> float:
        return min(auroc(scores_id if i is None else scores_id[i],
                         by_family[f] if js is None else by_family[f][js[f]]) for f in families)

    gen = torch.Generator().manual_seed(seed + 100)
    draws = []
    for _ in range(ecfg.verdict_bootstrap):
        i = torch.randint(0, n_id, (n_id,), generator=gen)
        js = {f: torch.randint(0, director.family_scores[f].shape[0], (director.family_scores[f].shape[0],),
                               generator=gen) for f in families}
        draws.append(worst(val_dir, director.family_scores, i, js) - worst(val_post, posthoc.family_scores, i, js))
    values = torch.tensor(draws, dtype=torch.float64)
    ci = (float(values.quantile(0.025)), float(values.quantile(0.975)))
    out.append(comparison("OOD-validation families, worst case", "worst_auroc",
                          worst(val_dir, director.family_scores), worst(val_post, posthoc.family_scores), ci,
                          margin=ecfg.verdict_auroc, counts_for_kernel=True))
    return out


def compare_paths(director: PathFigures, posthoc: PathFigures, val_labels: torch.Tensor, shift_labels: torch.Tensor,
                  shift_name: str, descriptions: dict[str, str], ecfg: ExportConfig, seed: int
                  ) -> list[VerdictComparison]:
    """Every comparison the verdict reads, in the order the pages show them."""
    return [accuracy_comparison("validation", director.val, posthoc.val, val_labels),
            *calibration_comparisons("validation", director.val, posthoc.val, val_labels, ecfg, seed, shift=False),
            *calibration_comparisons(shift_name, director.shift, posthoc.shift, shift_labels, ecfg, seed + 1,
                                     shift=True),
            *ood_comparisons(director, posthoc, descriptions, ecfg, seed + 2)]


def described(c: VerdictComparison | PathComparison) -> str:
    """One comparison in words: 'NLL on validation +0.012 [+0.004, +0.020]'."""
    names = {"nll": "NLL", "ece": "ECE", "auroc": "AUROC", "fpr95": "FPR95", "worst_auroc": "worst-family AUROC",
             "accuracy": "accuracy"}
    scale = 100.0 if c.metric in ("ece", "fpr95", "accuracy") else 1.0
    unit = " points" if scale == 100.0 else ""
    low, high = c.ci95
    return (f"{names[c.metric]} on {c.set} {scale * c.difference:+.3f}{unit} "
            f"[{scale * low:+.3f}, {scale * high:+.3f}]")


PATH_NAMES = {"director": "DIRECTOR",
              "hybrid": "the hybrid (the backbone's own forward with the kernel's error beside it)",
              "posthoc": "the post-hoc path (the backbone's own forward with the same post-hoc tools, no kernel)"}


def earns(comparisons: list[VerdictComparison] | list[PathComparison]) -> bool:
    """The rule every richer path meets: a practical gain somewhere and a material loss nowhere."""
    return any(c.practical for c in comparisons) and not any(c.material_loss for c in comparisons)


def as_path_comparison(c: VerdictComparison) -> PathComparison:
    """A comparison computed with the richer path in DIRECTOR's place and the cheaper one in the post-hoc path's, under
    the pair's own names."""
    side = {"director": "richer", "posthoc": "cheaper", "neither": "neither"}[c.favours]
    return PathComparison(set=c.set, metric=c.metric, richer=c.director, cheaper=c.posthoc, difference=c.difference,
                          ci95=c.ci95, favours=side, margin=c.margin, counts_for_richer=c.counts_for_kernel,
                          practical=c.practical, material_loss=c.material_loss)


def path_pair(richer: str, cheaper: str, comparisons: list[PathComparison]) -> PathPair:
    """Whether ``richer`` earns its place over ``cheaper``, with the sentence that says why."""
    return PathPair(richer=richer, cheaper=cheaper, earns=earns(comparisons),
                    sentence=pair_sentence(richer, cheaper, comparisons), comparisons=comparisons)


def pair_sentence(richer: str, cheaper: str, comparisons: list[PathComparison]) -> str:
    """One pair's outcome in words, naming its gains and its material losses."""
    name, other = PATH_NAMES[richer].split(" (")[0], PATH_NAMES[cheaper].split(" (")[0]
    gains = [c for c in comparisons if c.practical]
    losses = [c for c in comparisons if c.material_loss]

    def listed(rows: list[PathComparison]) -> str:
        return "; ".join(described(c) for c in rows[:3])

    if gains and not losses:
        return f"{name} earns its place over {other} ({name} minus {other}: {listed(gains)}; no material loss)"
    if losses:
        return (f"{name} does not earn its place over {other}: it is worse beyond noise and its margin on "
                f"{listed(losses)}")
    return (f"{name} adds nothing worth its cost over {other}: no measure gains beyond noise and its practical "
            "margin")


def served_path(requested: str, kernel_wins: bool, pairs: list[PathPair]) -> str:
    """What a version serves: the requested path, or under ``auto`` the richest path that earns its place over every
    cheaper one (DIRECTOR over the post-hoc path and, when the hybrid was measured, over the hybrid; the hybrid over the
    post-hoc path), else the post-hoc path."""
    if requested != "auto":
        return requested
    by_name = {(p.richer, p.cheaper): p for p in pairs}
    over_hybrid = by_name.get(("director", "hybrid"))
    if kernel_wins and (over_hybrid is None or over_hybrid.earns):
        return "director"
    hybrid = by_name.get(("hybrid", "posthoc"))
    return "hybrid" if hybrid is not None and hybrid.earns else "posthoc"


def decide(comparisons: list[VerdictComparison], requested: str, ecfg: ExportConfig,
           cost: dict[str, object] | None = None, pairs: list[PathPair] | None = None) -> KernelVerdict:
    """Which path a version serves, and the sentence that says why (``pairs``: the hybrid's comparisons, when it was
    measured)."""
    pairs = pairs or []
    gains = [c for c in comparisons if c.practical]
    losses = [c for c in comparisons if c.material_loss]
    kernel_wins = bool(gains) and not losses
    served = served_path(requested, kernel_wins, pairs)
    sentence = _why(comparisons, gains, losses) + "".join(f"; {p.sentence}" for p in pairs)
    serves = f"serves {PATH_NAMES[served]}"
    unforced = served_path("auto", kernel_wins, pairs)
    forced = (f"; export.method asked for {requested}, so it {serves}" if requested != "auto" and served != unforced
              else f", so this version {serves}")
    margins = {"ece": ecfg.verdict_ece, "nll_relative": ecfg.verdict_nll_relative, "auroc": ecfg.verdict_auroc,
               "fpr95": ecfg.verdict_fpr95}
    return KernelVerdict(requested=requested, served=served, kernel_wins=kernel_wins,
                         sentence=sentence[0].upper() + sentence[1:] + forced + ".", comparisons=comparisons,
                         margins=margins, cost=cost, pairs=pairs)


def _listed(rows: list[VerdictComparison], most: int = 3) -> str:
    return "; ".join(described(c) for c in rows[:most])


def _why(comparisons: list[VerdictComparison], gains: list[VerdictComparison],
         losses: list[VerdictComparison]) -> str:
    """The verdict's reason, naming the gains, the material losses and what was beyond noise but inside its size."""
    paired = "paired against the backbone with the same post-hoc tools (DIRECTOR minus post-hoc)"
    small_losses = [c for c in comparisons if c.favours == "posthoc" and not c.material_loss]
    within = f"worse beyond noise but within its margin on {_listed(small_losses, 2)}" if small_losses else ""
    if gains and not losses:
        return (f"the DIRECTOR kernel earns its place on this model: {paired}, {_listed(gains)}, and it is worse "
                f"beyond noise and its margin on nothing" + (f" ({within})" if within else ""))
    if losses:
        return (f"the DIRECTOR kernel does not earn its place on this model: {paired}, it is worse beyond noise and "
                f"its margin on {_listed(losses)}"
                + (f" (and gains beyond its margin on {_listed(gains)})" if gains else ""))
    small_gains = [c for c in comparisons if c.favours == "director"]
    notes = [*([f"beyond noise but under its margin: {_listed(small_gains, 2)}"] if small_gains else []),
             *([within] if within else [])]
    return (f"the DIRECTOR kernel adds nothing worth its cost on this model: {paired}, no measure gains beyond "
            f"noise and its practical margin" + (f" ({'; '.join(notes)})" if notes else ""))


def path_figures(path: ServedPath, parts: ExportParts, shift: HeldOutShift, seed: int) -> PathFigures:
    """What ``path`` serves on validation, the held-out shift and every OOD-validation family."""
    val = path.val_inputs(parts.data.val)
    families = {name: path.ood_score(path.family_inputs(name, family.split))
                for name, family in parts.ood_families.items()}
    return PathFigures(val, path.ood_score(val), path.inputs("held_out_shift", shift.split, seed), families)


def kernel_verdict(paths: dict[str, ServedPath], parts: ExportParts, shift: HeldOutShift, cfg: PipelineConfig,
                   backbone_parameters: int) -> KernelVerdict:
    """DIRECTOR, the post-hoc path and (when ``paths`` holds it) the hybrid, paired on validation, its held-out
    ``shift`` and the OOD-validation families: DIRECTOR minus post-hoc (``comparisons``), the hybrid minus post-hoc
    and DIRECTOR minus the hybrid (``pairs``); and what ``export.method`` serves."""
    figures = {name: path_figures(path, parts, shift, cfg.seed) for name, path in paths.items()}
    descriptions = {name: family.description for name, family in parts.ood_families.items()}
    shift_name = shift.description.split(" + ")[-1]

    def compare(richer: str, cheaper: str) -> list[VerdictComparison]:
        return compare_paths(figures[richer], figures[cheaper], parts.data.val.labels, shift.split.labels, shift_name,
                             descriptions, cfg.export, cfg.seed)

    pairs = ([path_pair(richer, cheaper, [as_path_comparison(c) for c in compare(richer, cheaper)])
              for richer, cheaper in (("hybrid", "posthoc"), ("director", "hybrid"))] if "hybrid" in paths else [])
    cost = {name: {"parameters": sum(p.numel() for p in path.module.parameters()),
                   "default_samples": path.default_samples} for name, path in paths.items()}
    return decide(compare("director", "posthoc"), cfg.export.method, cfg.export,
                  {**cost, "backbone_parameters": backbone_parameters}, pairs)
