"""The shift stage: accuracy, calibration and what each method's OOD flag does on shifted inputs (corrupted test
images, or sentences of other domains labelled by the same rule)."""

from __future__ import annotations

from typing import Any

import torch
from tqdm import tqdm

from training.evaluate.evaluation import POSTHOC, Evaluation, Method, summary_of
from training.evaluate.sets import shift_sets
from training.metrics import classification_report, paired_bootstrap
from training.posthoc.ood_selection import ScoreInputs


def flag_split(flagged: torch.Tensor, correct: torch.Tensor) -> dict[str, float | None]:
    """The share of inputs flagged OOD and the accuracy of the kept and of the flagged ones (None when empty)."""
    kept = ~flagged

    def share(mask: torch.Tensor) -> float | None:
        return float(correct[mask].float().mean()) if bool(mask.any()) else None

    return {"flag_rate": float(flagged.float().mean()), "accuracy_kept": share(kept),
            "accuracy_flagged": share(flagged)}


REFERENCES = {"temperature_scaling": "paired_vs_temperature_scaling", POSTHOC: "paired_vs_posthoc"}  # paired against


def paired_against_reference(pooled: dict[str, dict[str, list[torch.Tensor]]], labels: dict[str, list[torch.Tensor]],
                             methods: list[Method], reference: str, n_boot: int, seed: int
                             ) -> dict[str, dict[str, Any]]:
    """Per DIRECTOR method and level (a severity, or "mean" over the text domains): its accuracy, ECE and NLL minus
    the ``reference`` method's on the level's inputs pooled over the corruption types or domains, with paired
    bootstrap intervals (``training.metrics.paired_bootstrap``; the pooled ECE is one ECE over all those inputs, not
    the mean of the per-type ECEs the tables show)."""
    if reference not in pooled:
        return {}
    out: dict[str, dict[str, Any]] = {}
    for method in (m for m in methods if m.family == "director"):
        out[method.key] = {level: paired_bootstrap(torch.cat(pooled[method.key][level]),
                                                   torch.cat(pooled[reference][level]), torch.cat(labels[level]),
                                                   n_boot, seed)
                           for level in labels}
    return out


def evaluate_shift(evaluation: Evaluation, methods: list[Method]) -> dict[str, Any]:
    """Accuracy, ECE and NLL per shifted set, and what each method's OOD flag (its own score at its 95%-TPR threshold,
    from ``test_and_ood``) does there: the share flagged and the accuracy of kept against flagged inputs. Images: per
    corruption type and severity, and per severity averaged over the types (``by_type``, ``by_severity``); texts: per
    domain and averaged over the domains (``by_domain``). Every DIRECTOR method is also paired against temperature
    scaling and against the post-hoc path per level (``paired_vs_temperature_scaling``, ``paired_vs_posthoc``)."""
    per_method: dict[str, Any] = {m.key: {} for m in methods}
    pooled: dict[str, dict[str, list[torch.Tensor]]] = {m.key: {} for m in methods}  # method -> level -> [N, C]s
    pooled_labels: dict[str, list[torch.Tensor]] = {}  # level -> [N]s
    for shifted in tqdm(shift_sets(evaluation.cfg, evaluation.inputs), desc="shift", leave=False):
        level = "mean" if shifted.level is None else str(shifted.level)
        pooled_labels.setdefault(level, []).append(shifted.split.labels)
        for method in methods:
            native = evaluation.native_scores(method, shifted.set_name, shifted.split)
            summary = summary_of(evaluation.logits(method.source, shifted.set_name, shifted.split), method, native)
            pooled[method.key].setdefault(level, []).append(summary.probabilities)
            report = classification_report(summary.probabilities, shifted.split.labels)
            entry: dict[str, Any] = {k: report[k] for k in ("accuracy", "ece", "nll")}
            entry["mean_mutual_information"] = float(summary.mutual_information.mean())
            rule, threshold = evaluation.flag_rules[method.key]
            flagged = ScoreInputs(summary, native).score(rule.name, rule.terms) > threshold  # [N]
            entry.update(flag_split(flagged, summary.probabilities.argmax(-1) == shifted.split.labels))
            entry["n"] = len(shifted.split)
            result = per_method[method.key]
            if shifted.level is None:
                result.setdefault("by_domain", {})[shifted.group] = entry
            else:
                result.setdefault("by_type", {}).setdefault(shifted.group, {})[str(shifted.level)] = entry
    for result in per_method.values():
        if "by_domain" in result:
            result["mean"] = mean_entry(list(result["by_domain"].values()))
            continue
        result["by_severity"] = {str(severity): mean_entry([by_level[str(severity)]
                                                            for by_level in result["by_type"].values()])
                                 for severity in evaluation.ev.severities}
    for reference, field in REFERENCES.items():
        paired = paired_against_reference(pooled, pooled_labels, methods, reference, evaluation.ev.bootstrap,
                                          evaluation.cfg.seed)
        for key, by_level in paired.items():
            per_method[key][field] = by_level
    return per_method


def mean_entry(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    """The mean of each figure over ``rows``, over the rows that have it (None where none has)."""
    out: dict[str, float | None] = {}
    for key in (k for k in rows[0] if k != "n"):
        present = [r[key] for r in rows if r[key] is not None]
        out[key] = sum(present) / len(present) if present else None
    return out
