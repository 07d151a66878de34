"""What a manifest records about the artifact that will be served, whatever its method, all measured on validation
sets (never the test split): the noise temperature, the default sample count, the served temperature, reference
distributions for drift, and the OOD score with its thresholds per sample count (docs/method.md and
docs/architecture.md)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch

from models.uncertainty import (
    COMBINED,
    INPUT_SCORES,
    ScoreTemperature,
    ScoreTerm,
    UncertaintySummary,
    summarize,
)
from training.config import ExportConfig
from training.data.ood_families import OodFamily, selection_description
from training.loading import AnySplit, Director, split_sampled_logits
from training.metrics import classification_report
from training.ood_metrics import threshold_at_tpr
from training.posthoc import draws
from training.posthoc.calibration import fit_temperature
from training.posthoc.draws import scored_pass
from training.posthoc.ood_selection import (
    FLOOR_RULE,
    LOG_SCALED,
    SELECTION_RULE,
    InputScoreCache,
    InputScores,
    OodChoice,
    ScoreInputs,
    choose_ood_score,
    returns_input_scores,
    score_names,
    standardised,
)

QUANTILES = 101  # reference distributions are stored as this many evenly spaced quantiles


def sample_split(model: torch.nn.Module, split: AnySplit, n_samples: int, seed: int) -> torch.Tensor:
    """Sampled logits [S, N, C] of an image or text split under ``seed``; inside an export, each pass once
    (``training.posthoc.draws``: with the per-input scores in the same pass where the model returns them)."""
    cache = draws.active()
    if cache is None:
        torch.manual_seed(seed)
        return split_sampled_logits(model, split, n_samples)  # [S, N, C]
    names = score_names(model) if returns_input_scores(model) else ()
    return cache.sampled(model, split, n_samples, seed, split_sampled_logits,
                         lambda: scored_pass(model, split, n_samples, names) if names else None)


def fit_noise_scale(director: Director, split: AnySplit, grid: list[float], n_samples: int, seed: int
                    ) -> tuple[float, dict[str, float]]:
    """Noise temperature: the std multiplier minimising validation NLL, set on ``director``'s buffer. A 1-point
    grid is a choice, not a fit: that value is set (an empty grid keeps 1.0)."""
    if len(grid) <= 1:
        scale = float(grid[0]) if grid else 1.0
        director.rollout.noise_scale.fill_(scale)
        return scale, {}
    scores = {}
    for scale in grid:
        director.rollout.noise_scale.fill_(scale)
        probs = summarize(sample_split(director, split, n_samples, seed)).probabilities
        scores[str(scale)] = classification_report(probs, split.labels)["nll"]
    best = float(min(scores, key=scores.get))
    director.rollout.noise_scale.fill_(best)
    return best, scores


def fit_noise_shape(director: Director, clean: AnySplit, shifted: AnySplit, correlations: list[float],
                    scales: list[float], n_samples: int, seed: int
                    ) -> tuple[float, float, dict[str, dict[str, float]]]:
    """The token correlation and noise temperature (``models.director.StochasticRollout``) set on ``director``'s
    buffers: among the grid points whose NLL on ``clean`` validation inputs is within noise of the best clean one
    (``within_noise``), the one with the lowest NLL on ``shifted`` (a held-out shift of them). A shift alone would be
    a poor objective: its NLL is several times the clean one's and asks for all the noise the grid offers, at the
    price of in-distribution calibration. Returns (rho, scale, every grid point's figures keyed "rho=<r> scale=<s>")."""
    rollout = director.rollout
    clean_nll: dict[str, torch.Tensor] = {}  # label -> [N]
    grid: dict[str, dict[str, float]] = {}
    for rho in correlations:
        for scale in scales:
            rollout.set_token_correlation(rho)
            rollout.noise_scale.fill_(scale)
            label = f"rho={rho:g} scale={scale:g}"
            clean_nll[label] = per_input_nll(sample_split(director, clean, n_samples, seed), clean.labels)
            shifted_nll = per_input_nll(sample_split(director, shifted, n_samples, seed), shifted.labels)
            grid[label] = {"rho": rho, "scale": scale, "clean_nll": float(clean_nll[label].mean()),
                           "shifted_nll": float(shifted_nll.mean())}
    if not grid:
        raise ValueError("the grid of token correlations and noise scales is empty")
    best_clean = min(grid, key=lambda label: float(clean_nll[label].mean()))
    eligible = []
    for label, point in grid.items():
        point["clean_minus_best"], point["stderr"] = paired_difference(clean_nll[label] - clean_nll[best_clean])
        if within_noise(point["clean_minus_best"], point["stderr"]):
            eligible.append(label)
    chosen = min(eligible, key=lambda label: grid[label]["shifted_nll"])
    rho, scale = float(grid[chosen]["rho"]), float(grid[chosen]["scale"])
    rollout.set_token_correlation(rho)
    rollout.noise_scale.fill_(scale)
    return rho, scale, grid


def paired_difference(diff: torch.Tensor) -> tuple[float, float]:
    """The mean of paired per-input differences [N] and its standard error."""
    stderr = float(diff.std() / math.sqrt(diff.shape[0])) if diff.shape[0] > 1 else 0.0
    return float(diff.mean()), stderr


def within_noise(mean: float, stderr: float) -> bool:
    """The export's one rule for "no measurably worse": a paired mean difference of at most two standard errors (plus
    float rounding: a noise-free model gives equal NLLs)."""
    return mean <= 2.0 * stderr + 1e-6


def per_input_nll(logits: torch.Tensor, labels: torch.Tensor, temperature: float | torch.Tensor = 1.0
                  ) -> torch.Tensor:
    """-log p(label) of ``mean_s softmax(z_s / T)`` for every input [N] (logits [S, N, C]; T one or [N])."""
    probs = summarize(logits, temperature).probabilities  # [N, C]
    return -probs.gather(1, labels[:, None]).squeeze(1).clamp_min(1e-12).log()  # [N]


NllTable = dict[str, dict[str, float]]  # "<S>" -> NLL, its paired difference from the reference's, standard error


def choose_default_samples(model: torch.nn.Module, split: AnySplit, counts: list[int], reference: int, seed: int,
                           shifted: AnySplit | None = None) -> tuple[int, NllTable, NllTable]:
    """The smallest S in ``counts`` whose validation NLL is within noise of S = ``reference``'s (``within_noise`` on
    the paired per-input difference NLL_S - NLL_ref). With ``shifted`` (the held-out
    shift the noise was shaped on) S must also be within noise of the reference's there: noise shaped for shifted
    inputs pays off only at the S that averages it. Returns S, the validation table and the shift's (empty without
    one)."""
    sets = [split, *([shifted] if shifted is not None else [])]
    refs = [per_input_nll(sample_split(model, s, reference, seed), s.labels) for s in sets]  # each [N]
    tables: list[NllTable] = [{} for _ in sets]
    for n_samples in sorted(c for c in counts if c <= reference):
        within = True
        for s, ref, table in zip(sets, refs, tables, strict=True):
            # another seed: the draws at S are not a prefix of the reference's draws
            mean, stderr = paired_difference(
                per_input_nll(sample_split(model, s, n_samples, seed + 1), s.labels) - ref)  # of [N]
            table[str(n_samples)] = {"nll": float(ref.mean()) + mean, "minus_reference": mean, "stderr": stderr}
            within &= within_noise(mean, stderr)
        if within:
            for ref, table in zip(refs, tables, strict=True):
                table[str(reference)] = {"nll": float(ref.mean()), "minus_reference": 0.0, "stderr": 0.0}
            return n_samples, tables[0], tables[1] if shifted is not None else {}
    return reference, tables[0], tables[1] if shifted is not None else {}


def served_temperature(logits: torch.Tensor, labels: torch.Tensor) -> tuple[float, dict[str, float]]:
    """Temperature scaling of the sampled logits [S, N, C], kept only when it wins on held-out validation: fitted on
    the first half, it must lower the second half's NLL; then the temperature is refitted on all of it (else 1)."""
    half = labels.shape[0] // 2
    t_half = fit_temperature(logits[:, :half], labels[:half])
    held_out = {"nll_t1": float(per_input_nll(logits[:, half:], labels[half:]).mean()),
                "nll_fitted": float(per_input_nll(logits[:, half:], labels[half:], t_half).mean()),
                "temperature_first_half": t_half}
    if held_out["nll_fitted"] >= held_out["nll_t1"]:
        return 1.0, held_out
    return fit_temperature(logits, labels), held_out


def temperature_on_shift(temperature: float, clean: torch.Tensor, clean_labels: torch.Tensor, shifted: torch.Tensor,
                         shifted_labels: torch.Tensor) -> tuple[float, dict[str, float]]:
    """The served temperature when the noise was shaped on a held-out shift: the rule ``fit_noise_shape`` applies,
    between ``temperature`` (fitted on clean validation) and 1. Among the two whose clean validation NLL is within two
    standard errors of the better one (paired per input), the one with the lower NLL on the shift (sampled logits
    [S, N, C] of each): a temperature fitted on clean inputs alone sharpens what the noise was shaped to soften."""
    candidates = {"fitted": temperature, "t1": 1.0}
    clean_nll = {k: per_input_nll(clean, clean_labels, t) for k, t in candidates.items()}  # each [N]
    shift_nll = {k: float(per_input_nll(shifted, shifted_labels, t).mean()) for k, t in candidates.items()}
    best = min(clean_nll, key=lambda k: float(clean_nll[k].mean()))
    eligible = [k for k, nll in clean_nll.items() if within_noise(*paired_difference(nll - clean_nll[best]))]
    chosen = min(eligible, key=shift_nll.get)
    record = {"shift_nll_fitted": shift_nll["fitted"], "shift_nll_t1": shift_nll["t1"],
              "clean_nll_fitted": float(clean_nll["fitted"].mean()), "clean_nll_t1": float(clean_nll["t1"].mean())}
    return candidates[chosen], record


def temperature_terms(choice: OodChoice, n_samples: int, val_inputs: InputScores) -> tuple[ScoreTerm, ...]:
    """What a score temperature reads: the served OOD score at ``n_samples`` when it reads per-input scores only (a
    per-input score standardised on validation, or a combination of them), else nothing: a score computed from the
    logits would move with the temperature that divides them."""
    rule = choice.rule_at(n_samples)
    if rule.name == COMBINED and all(term.score in INPUT_SCORES for term in rule.terms):
        return rule.terms
    if rule.name in INPUT_SCORES:
        return (standardised(val_inputs[rule.name], rule.name, 1.0, log=rule.name in LOG_SCALED),)
    return ()


def fit_temperature_slope(base: float, terms: tuple[ScoreTerm, ...], grid: list[float], clean: torch.Tensor,
                          clean_labels: torch.Tensor, clean_inputs: InputScores, shifted: torch.Tensor,
                          shifted_labels: torch.Tensor, shifted_inputs: InputScores
                          ) -> tuple[float, dict[str, dict[str, float]]]:
    """The slope of a score temperature (``models.uncertainty.ScoreTemperature``) by ``fit_noise_shape``'s rule: among
    the slopes in ``grid`` whose clean validation NLL is within noise of the best (paired per input), the one with the
    lowest NLL on the held-out shift (sampled logits [S, N, C] of each, their per-input scores). Returns the slope and
    every slope's figures."""
    per_slope = {}
    for slope in grid:
        temperature = ScoreTemperature(base, slope, terms)
        per_slope[slope] = (per_input_nll(clean, clean_labels, temperature(clean_inputs)),  # [N]
                            per_input_nll(shifted, shifted_labels, temperature(shifted_inputs)))  # [N']
    best = min(per_slope, key=lambda k: float(per_slope[k][0].mean()))
    table = {}
    for slope, (clean_nll, shift_nll) in per_slope.items():
        mean, stderr = paired_difference(clean_nll - per_slope[best][0])
        table[f"{slope:g}"] = {"clean_nll": float(clean_nll.mean()), "clean_minus_best": mean,
                               "clean_stderr": stderr, "eligible": float(within_noise(mean, stderr)),
                               "shift_nll": float(shift_nll.mean())}
    chosen = min((k for k in per_slope if table[f"{k:g}"]["eligible"]), key=lambda k: table[f"{k:g}"]["shift_nll"])
    return chosen, table


def reference_section(summary: UncertaintySummary, labels: torch.Tensor, n_samples: int) -> dict[str, Any]:
    """Validation metrics and the quantiles of confidence, entropy and MI the server's drift gauges compare with."""
    q = torch.linspace(0, 1, QUANTILES, dtype=torch.float64)
    report = classification_report(summary.probabilities, labels)
    deciles = torch.linspace(0.1, 0.9, 9, dtype=torch.float64)
    return {
        "split": "validation", "n_samples": n_samples, "n_inputs": int(labels.shape[0]), **report,
        "quantile_levels": q.tolist(),
        "confidence_quantiles": torch.quantile(summary.confidence.double(), q).tolist(),
        "predictive_entropy_quantiles": torch.quantile(summary.predictive_entropy.double(), q).tolist(),
        "mutual_information_quantiles": torch.quantile(summary.mutual_information.double(), q).tolist(),
        "confidence_deciles": torch.quantile(summary.confidence.double(), deciles).tolist(),
    }


@dataclass
class ServedStatistics:
    """What every manifest needs from the artifact that will be served, whatever its method."""

    reference: dict[str, Any]
    ood: dict[str, Any]  # the manifest's ``ood`` section
    choice: OodChoice
    input_scores: InputScoreCache  # of the served module: "val", "ood_validation" and whatever export adds
    val_logits: torch.Tensor  # [S, N, C]: the validation draws at the default S the reference was measured on
    family_logits: dict[str, torch.Tensor]  # OOD-validation family -> its draws [S, M, C] at the default S


def served_statistics(served: torch.nn.Module, val: AnySplit, ecfg: ExportConfig,
                      sample_counts: list[int], default_s: int, seed: int, families: dict[str, OodFamily],
                      temperature: float = 1.0) -> ServedStatistics:
    """Reference distributions on validation, the OOD score chosen over the OOD-validation ``families`` (none of the
    reported sets; ``training.posthoc.ood_selection``), and its 95%-TPR threshold per sample count, all under the
    served ``temperature``."""
    val_logits = sample_split(served, val, default_s, seed)  # [S, Nv, C]
    val_summary = summarize(val_logits, temperature)
    reference = reference_section(val_summary, val.labels, default_s)
    input_scores = InputScoreCache(served)
    val_inputs = ScoreInputs(val_summary, input_scores("val", val))
    family_logits = {name: sample_split(served, family.split, default_s, seed) for name, family in families.items()}
    family_inputs = {name: ScoreInputs(summarize(family_logits[name], temperature),
                                       input_scores(f"ood_validation:{name}", family.split))
                     for name, family in families.items()}
    choice = choose_ood_score(val_inputs, family_inputs, default_s,
                              {name: family.weight for name, family in families.items()})

    thresholds: dict[str, dict[str, Any]] = {}
    # thresholds come from a validation subset; the reference OOD rate is measured on the whole split below. The
    # draws at every other S are the first S of one pass at the largest (each input's draws are independent, so the
    # first S of them are S draws): one pass instead of one per sample count
    id_subset = val.head(ecfg.threshold_images)
    others = [n for n in sample_counts if n != default_s]
    nested = sample_split(served, id_subset, max(others), seed) if others else None  # [S_max, N, C]
    for n_samples in sample_counts:
        if nested is None or n_samples == default_s:  # draws at this sample count exist already: reuse them
            inputs = val_inputs.head(len(id_subset))
        else:  # the per-input scores do not depend on S
            inputs = ScoreInputs(summarize(nested[:n_samples], temperature), val_inputs.head(len(id_subset)).inputs)
        rule = choice.rule_at(n_samples)
        thresholds[str(n_samples)] = {"score": rule.name, "threshold": threshold_at_tpr(inputs.score(rule.name,
                                                                                                     rule.terms))}
    default_entry = thresholds[str(default_s)]
    reference["ood_rate"] = float((val_inputs.score(default_entry["score"], choice.terms) > default_entry["threshold"])
                                  .float().mean())
    ood = {"score": choice.chosen.name, "fallback_score": choice.fallback.name, "tpr": 0.95, "thresholds": thresholds,
           "selection_set": selection_description(families), "selection_auroc": choice.selection_auroc,
           "selection_choice": choice.label, "selection_rule": SELECTION_RULE,
           "selection_families": {name: {"description": family.description, "weight": family.weight,
                                         "n": len(family.split), "auroc": choice.family_auroc[name]}
                                  for name, family in families.items()},
           "selection_regret": choice.regret,
           "selection_floor": {"rule": FLOOR_RULE, "not_served": choice.below_floor}}
    if choice.terms:
        ood["combination"] = [dataclasses.asdict(term) for term in choice.terms]
    return ServedStatistics(reference, ood, choice, input_scores, val_logits, family_logits)
