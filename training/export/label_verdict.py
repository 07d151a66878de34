"""The kernel's verdict for a multi-label model (docs/method.md, "Multi-label models"): the single-label verdict's
comparisons and rule (``training.export.verdict``) on what a sigmoid per label serves.

DIRECTOR as it would be served against the post-hoc path with the same post-hoc tools, DIRECTOR minus post-hoc with a
95% interval, on validation and its held-out shift:

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
from training.export.parts import ExportParts
from training.export.served_statistics import paired_difference
from training.export.verdict import comparison, decide, ood_comparisons
from training.multi_label_metrics import mean_label_ece
from training.ood_metrics import bootstrap_interval


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


def label_verdict(kernel: LabelPath, plain: LabelPath, parts: ExportParts, shift: HeldOutShift, cfg: PipelineConfig,
                  backbone_parameters: int) -> KernelVerdict:
    """DIRECTOR (``kernel``) against the post-hoc path (``plain``), paired on validation, its held-out ``shift`` and
    the OOD-validation families, and what ``export.method`` serves."""
    ecfg, seed, val = cfg.export, cfg.seed, parts.data.val
    shift_name = shift.description.split(" + ")[-1]
    cuts = (kernel.calibration.thresholds, plain.calibration.thresholds)
    comparisons = [
        *labelled_comparisons("validation", kernel.calibration.probabilities(kernel.val_logits),
                              plain.calibration.probabilities(plain.val_logits), val.labels, cuts, ecfg, seed,
                              shift=False),
        *labelled_comparisons(shift_name, kernel.probabilities(shift.split, seed + 2),
                              plain.probabilities(shift.split, seed + 2), shift.split.labels, cuts, ecfg, seed + 1,
                              shift=True)]
    if parts.ood_families:
        comparisons += ood_comparisons(kernel.rule, plain.rule, {name: family.description for name, family
                                                                 in parts.ood_families.items()}, ecfg, seed + 2)
    cost = {"director": {"parameters": sum(p.numel() for p in kernel.module.parameters()),
                         "default_samples": kernel.default_s},
            "posthoc": {"parameters": sum(p.numel() for p in plain.module.parameters()), "default_samples": 1},
            "backbone_parameters": backbone_parameters}
    return decide(comparisons, ecfg.method, ecfg, cost)
