"""DIRECTOR's own contribution to OOD detection, measured (docs/method.md, "The kernel error over more than one step").

The feature scores (MDS, RMDS, KNN, ViM) read the backbone's own penultimate features, so they do not depend on the
kernel; the kernel error does, and over K diffused steps it averages the kernel's teacher-forced error along the
backbone's last K transitions. For the run's own K and each K in ``evaluate.kernel_error_depths`` (distilled on the
main run's frozen backbone for ``evaluate.kernel_depth_epochs``, cached beside the ablations), this stage reports per
set the kernel error alone, the best feature score alone and the exporter's standardised combination of the two, the
feature score and the combination's weight chosen on the OOD-validation set only (``choose_ood_score``, the one
selection code), with a paired bootstrap interval of the combination's AUROC minus the feature score's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from models.uncertainty import FEATURE_SCORES, KERNEL_ERROR, summarize
from training.config import PipelineConfig
from training.evaluate.ablations import ablation_config, ensure_distilled
from training.evaluate.detectors import paired_auroc_difference
from training.evaluate.evaluation import Evaluation, family_set
from training.loading import AnySplit, RunBackbone
from training.ood_metrics import ood_report
from training.posthoc.modality_parts import with_teacher
from training.posthoc.ood_selection import Candidate, OodChoice, ScoreInputs, choose_ood_score, split_input_scores


def depth_variant(cfg: PipelineConfig, depth: int) -> PipelineConfig:
    """The ``depth_<K>`` ablation variant at ``evaluate.kernel_depth_epochs``, in a folder of its own (the ablations
    stage's ``depth_<K>`` trains ``ablation_epochs``, so the two never share a cached kernel)."""
    epochs = cfg.evaluate.kernel_depth_epochs
    budget = dataclasses.replace(cfg, evaluate=dataclasses.replace(cfg.evaluate, ablation_epochs=epochs))
    variant = ablation_config(budget, f"depth_{depth}")
    return dataclasses.replace(variant, evaluate=cfg.evaluate,
                               run_dir=str(Path(cfg.run_dir) / "ablations" / f"depth_{depth}-e{epochs}"))


def is_kernel_and_feature(candidate: Candidate) -> bool:
    """A combination of the kernel error (first term) with a feature score."""
    terms = candidate.terms
    return len(terms) == 2 and terms[0].score == KERNEL_ERROR and terms[1].score in FEATURE_SCORES


def best(choice: OodChoice, keep: Callable[[str, Candidate], bool]) -> str:
    """The label with the highest OOD-validation AUROC among the candidates ``keep`` accepts (ties: the first)."""
    labels = [label for label, c in choice.candidates.items() if keep(label, c)]
    return max(labels, key=choice.selection_auroc.__getitem__)


def depth_report(scores: dict[str, ScoreInputs], families: dict[str, float], ood_sets: list[str], n_boot: int,
                 seed: int) -> dict[str, Any]:
    """One K: the exporter's choice on the validation sets of ``scores`` (set name -> summary and per-input scores
    with this K's kernel error; ``families``: the OOD-validation family sets and their weights), then per reported set
    the kernel error, the best feature score and the best kernel-error + feature combination (both chosen on OOD
    validation), and combination minus feature score."""
    choice = choose_ood_score(scores["val"], {name: scores[name] for name in families}, 1, families)
    feature = best(choice, lambda label, _: label in FEATURE_SCORES)
    combined = best(choice, lambda _, c: is_kernel_and_feature(c))
    rows = {"kernel_error": choice.candidates[KERNEL_ERROR], "feature": choice.candidates[feature],
            "combined": choice.candidates[combined]}
    per_set: dict[str, Any] = {}
    for set_name in ood_sets:
        test, ood = scores["test"], scores[set_name]
        values = {k: (test.score(c.name, c.terms), ood.score(c.name, c.terms)) for k, c in rows.items()}  # [N] pairs
        per_set[set_name] = {k: ood_report(*v) for k, v in values.items()}
        per_set[set_name]["combined_minus_feature"] = paired_auroc_difference(
            *values["combined"], *values["feature"], n_boot, seed)
    return {"feature_score": feature, "combined_score": combined,
            "validation_auroc": {"kernel_error": choice.selection_auroc[KERNEL_ERROR],
                                 "feature": choice.selection_auroc[feature],
                                 "combined": choice.selection_auroc[combined]},
            "ood": per_set}


def cost(depth: int, transitions: int) -> dict[str, Any]:
    """Layer-equivalents per input at S = 1 with the kernel error (a kernel step counted as one layer of the same
    width): the prefix (T - K) and the K sampled kernel steps, plus the K teacher layers and the K - 1 teacher-forced
    kernel steps beyond the first (which the sampled path shares). The feature scores need the same teacher layers."""
    total = (transitions - depth) + depth + depth + (depth - 1)
    return {"teacher_layers": depth, "extra_kernel_steps": depth - 1, "layer_equivalents_s1": total,
            "ratio_to_backbone": total / transitions}


def kernel_errors(model: torch.nn.Module, sets: dict[str, AnySplit]) -> dict[str, torch.Tensor]:
    """The kernel error [N] of every input of each named set under a DIRECTOR carrying its K teacher transitions."""
    out = {}
    for name, split in sets.items():
        scores = split_input_scores(model, split)
        assert scores is not None  # with_teacher gives it the transitions
        out[name] = scores[KERNEL_ERROR]
    return out


def depth_kernels(evaluation: Evaluation, main_depth: int, transitions: int
                  ) -> tuple[dict[int, Path], dict[str, str]]:
    """The run folder of each measured K (the main run's own first, then each listed K, distilled if not cached) and
    the listed K that cannot be measured, with why."""
    cfg = evaluation.cfg
    runs, skipped = {main_depth: evaluation.run_dir}, {}
    for depth in dict.fromkeys(cfg.evaluate.kernel_error_depths):
        if depth in runs:
            continue
        if not 1 <= depth <= transitions:
            skipped[str(depth)] = f"the backbone has {transitions} transitions"
            continue
        runs[depth] = ensure_distilled(cfg, depth_variant(cfg, depth))
    return runs, skipped


def evaluate_kernel_depth(evaluation: Evaluation, draws_test: int, served: str) -> dict[str, Any]:
    """Per K, the kernel error alone, with the best feature score and that feature score alone on every reported OOD
    set, the winner on OOD validation beside the served score (``served``, DIRECTOR's S = 1 choice) and each K's
    cost."""
    inputs, cfg = evaluation.inputs, evaluation.cfg
    transitions = evaluation.opened.view().num_steps
    main_depth = int(evaluation.sources["director"].model.rollout.num_steps)
    families = {family_set(name): family.weight for name, family in inputs.ood_families.items()}
    sets = {"val": inputs.val, **{family_set(name): family.split for name, family in inputs.ood_families.items()},
            "test": inputs.test, **inputs.ood}
    main = {name: evaluation.director_input_scores(name, split) for name, split in sets.items()}  # K-free features
    summaries = {name: summarize(evaluation.logits("director", name, split, draws_test if name == "test" else None
                                                   )[:1]) for name, split in sets.items()}  # the S = 1 summary
    runs, skipped = depth_kernels(evaluation, main_depth, transitions)
    depths: dict[str, Any] = {}
    for depth, run in runs.items():
        opened = RunBackbone.open(run)  # this depth's run: backbone.pt read once
        director, payload = opened.director()
        errors = ({name: main[name][KERNEL_ERROR] for name in sets} if depth == main_depth
                  else kernel_errors(with_teacher(director, opened.view()), sets))  # set -> [N]
        scores = {name: ScoreInputs(summaries[name], {**main[name], KERNEL_ERROR: errors[name]}) for name in sets}
        report = depth_report(scores, families, list(inputs.ood), cfg.evaluate.bootstrap, cfg.seed)
        depths[str(depth)] = {"epochs": len(payload["history"]), "tau": payload["tau"], "run": str(run),
                              "cost": cost(depth, transitions), **report}
    return {"transitions": transitions, "served_depth": main_depth, "served_score": served, "skipped": skipped,
            "depths": depths, "winner": winner(depths, served, main_depth)}


def winner(depths: dict[str, Any], served: str, served_depth: int) -> dict[str, Any]:
    """The variant with the highest OOD-validation AUROC: the feature score alone, or the kernel error of some K alone
    or combined with a feature score (ties: the feature score, then the smaller K, then the kernel error alone).
    ``served`` is a label of the exporter's choice, made at the run's own K (``served_depth``)."""
    first = next(iter(depths.values()))
    variants = {first["feature_score"]: first["validation_auroc"]["feature"]}
    for depth, entry in sorted(depths.items(), key=lambda item: int(item[0])):
        variants[f"{KERNEL_ERROR} K={depth}"] = entry["validation_auroc"]["kernel_error"]
        variants[f"{entry['combined_score']} K={depth}"] = entry["validation_auroc"]["combined"]
    label = max(variants, key=variants.__getitem__)
    return {"label": label, "validation_auroc": variants[label], "variants": variants,
            "differs_from_served": label not in (served, f"{served} K={served_depth}")}
