"""The kernel's verdict for a multi-label model (docs/method.md, "Multi-label models"): the single-label verdict's
comparisons and three-way rule (``training.export.verdict``) on what a sigmoid per label serves.

DIRECTOR as it would be served against the post-hoc path with the same post-hoc tools (and the hybrid against the
post-hoc path, DIRECTOR against the hybrid), the richer path minus the cheaper with a 95% interval, on validation and
its held-out shift:

- accuracy: each input's share of right yes/no decisions at its path's thresholds, paired per input (margin 0: a
  DIRECTOR less accurate than its backbone beyond noise is never served by ``auto``);
- NLL: binary cross-entropy summed over labels, paired per input;
- ECE: the mean of the labels' ECEs, paired bootstrap (the same resample for both paths); a gain counts for the
  kernel on the held-out shift only;

and on every OOD-validation family the served score's AUROC and FPR95 and the worst family's AUROC, as for a
single-label model.
"""

from __future__ import annotations

import torch

from artifact.contract import KernelVerdict, VerdictComparison
from models.tasks import MultiLabel
from training.config import ExportConfig, PipelineConfig
from training.data.held_out_shift import HeldOutShift
from training.export.label_paths import LabelPath, right_decisions
from training.export.verdict import as_path_comparison, comparison, decide, ood_comparisons, path_pair
from training.multi_label_metrics import mean_label_ece
from training.ood_metrics import bootstrap_interval
from training.posthoc.modality_parts import ExportParts
from training.posthoc.served_statistics import paired_difference


def paired_per_input(set_name: str, metric: str, director: torch.Tensor, posthoc: torch.Tensor, margin: float,
                     counts_for_kernel: bool) -> VerdictComparison:
    """A comparison of a per-input figure [N] of each path: the paired mean difference and its normal interval."""
    mean, stderr = paired_difference(director - posthoc)
    return comparison(set_name, metric, float(director.mean()), float(posthoc.mean()),
                      (mean - 1.96 * stderr, mean + 1.96 * stderr), margin=margin,
                      counts_for_kernel=counts_for_kernel)


def labelled_comparisons(set_name: str, p_dir: torch.Tensor, p_post: torch.Tensor, labels: torch.Tensor,
                         thresholds: tuple[list[float], list[float]], ecfg: ExportConfig, seed: int, shift: bool
                         ) -> list[VerdictComparison]:
    """Accuracy (validation only, at each path's ``thresholds``), NLL and ECE of the two paths' served probabilities
    [N, C] on one labelled set."""
    out = []
    if not shift:
        out.append(paired_per_input(set_name, "accuracy", right_decisions(p_dir, labels, thresholds[0]),
                                    right_decisions(p_post, labels, thresholds[1]), 0.0, False))
    nll_post = MultiLabel().per_input_nll(p_post, labels)  # [N]
    out.append(paired_per_input(set_name, "nll", MultiLabel().per_input_nll(p_dir, labels), nll_post,
                                ecfg.verdict_nll_relative * float(nll_post.mean()), True))
    ci = bootstrap_interval(lambda i, _: mean_label_ece(p_dir[i], labels[i]) - mean_label_ece(p_post[i], labels[i]),
                            labels.shape[0], 1, ecfg.verdict_bootstrap, seed)
    out.append(comparison(set_name, "ece", mean_label_ece(p_dir, labels), mean_label_ece(p_post, labels), ci,
                          margin=ecfg.verdict_ece, counts_for_kernel=shift))
    return out


def path_comparisons(richer: LabelPath, cheaper: LabelPath, parts: ExportParts, shift: HeldOutShift,
                     cfg: PipelineConfig) -> list[VerdictComparison]:
    """``richer`` minus ``cheaper``, paired on validation, its held-out ``shift`` and the OOD-validation families (the
    figures read as DIRECTOR's and the post-hoc path's in ``VerdictComparison``)."""
    ecfg, seed, val = cfg.export, cfg.seed, parts.data.val
    shift_name = shift.description.split(" + ")[-1]
    cuts = (richer.calibration.thresholds, cheaper.calibration.thresholds)
    comparisons = [
        *labelled_comparisons("validation", richer.calibration.probabilities(richer.val_logits),
                              cheaper.calibration.probabilities(cheaper.val_logits), val.labels, cuts, ecfg, seed,
                              shift=False),
        *labelled_comparisons(shift_name, richer.probabilities(shift.split, seed + 2),
                              cheaper.probabilities(shift.split, seed + 2), shift.split.labels, cuts, ecfg, seed + 1,
                              shift=True)]
    if parts.ood_families:
        comparisons += ood_comparisons(richer.rule, cheaper.rule, {name: family.description for name, family
                                                                   in parts.ood_families.items()}, ecfg, seed + 2)
    return comparisons


def label_verdict(paths: dict[str, LabelPath], parts: ExportParts, shift: HeldOutShift, cfg: PipelineConfig,
                  backbone_parameters: int) -> KernelVerdict:
    """DIRECTOR, the hybrid and the post-hoc path, paired on validation, its held-out ``shift`` and the OOD-validation
    families (DIRECTOR minus post-hoc; the hybrid minus post-hoc and DIRECTOR minus the hybrid as ``pairs``), and
    what ``export.method`` serves (``training.export.verdict.decide``)."""

    def compare(richer: str, cheaper: str) -> list[VerdictComparison]:
        return path_comparisons(paths[richer], paths[cheaper], parts, shift, cfg)

    pairs = [path_pair(richer, cheaper, [as_path_comparison(c) for c in compare(richer, cheaper)])
             for richer, cheaper in (("hybrid", "posthoc"), ("director", "hybrid"))]
    cost = {name: {"parameters": sum(p.numel() for p in path.module.parameters()), "default_samples": path.default_s}
            for name, path in paths.items()}
    return decide(compare("director", "posthoc"), cfg.export.method, cfg.export,
                  {**cost, "backbone_parameters": backbone_parameters}, pairs)
