"""Which OOD score a model serves, chosen by AUROC of in-distribution validation against several OOD-validation
families (never a reported OOD set) by a rule that asks a candidate to be close to the best on every family, so that
a score which wins one family and fails another is not served (``SELECTION_RULE``); the exporter and the evaluation
choose with the same function (docs/method.md, "An OOD score chosen to generalise").

Candidates: every score of the sampled logits defined at the sample count (mutual information needs S >= 2); for a
DIRECTOR whose ``scored_rows`` returns per-input scores (the artifact carries the backbone's own last K transitions,
and maybe the feature-space statistics), each of those scores; and the combinations ``w * z(a) + (1 - w) * z(b)`` of
the pairs (kernel error, best logit score s defined at every S), (kernel error, feature score) and (feature score, s),
each z standardised on in-distribution validation (the log of the kernel error and of the Mahalanobis distance, which
span orders of magnitude), w in ``COMBINATION_WEIGHTS``. Ties go to the simpler score (logit scores first)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields

import torch

from models.feature_scores import served_scores
from models.uncertainty import (
    COMBINED,
    FEATURE_SCORES,
    INPUT_SCORES,
    KERNEL_ERROR,
    OOD_SCORES,
    ScoreTerm,
    UncertaintySummary,
    ood_score,
)
from training.loading import AnySplit
from training.ood_metrics import auroc, paired_ood_interval
from training.posthoc import draws

SELECTION_RULE = ("lowest worst-case regret over the OOD-validation families: a candidate's regret on a family is the "
                  "best candidate's AUROC there minus its own (times the family's weight); ties to the higher mean "
                  "AUROC, then the simpler score")
FLOOR_SCORE = "max_softmax"  # the served score is never below it beyond noise on any family
FLOOR_RULE = ("never below the path's own max softmax beyond noise on any family: a candidate whose AUROC there is "
              "lower than max softmax's with the paired bootstrap's 95% interval of the difference below 0 is not "
              "served; the rule then chooses among the others")
FLOOR_BOOTSTRAP = 200  # paired resamples per family for the floor's interval
COMBINATION_WEIGHTS = (0.25, 0.5, 0.75)  # the first score's share of a combined score
LOG_SCALED = (KERNEL_ERROR, "mds", "mds_pp")  # standardised on a log scale (positive, spanning orders of magnitude)

InputScores = dict[str, torch.Tensor]  # per-input score name -> [N]


@dataclass(frozen=True)
class ScoreInputs:
    """What a set's OOD scores are computed from: its summary and, for a DIRECTOR, its per-input scores (the kernel
    error and the feature-space scores, [N] each)."""

    summary: UncertaintySummary
    inputs: InputScores | None = None

    @property
    def kernel_error(self) -> torch.Tensor | None:
        return None if self.inputs is None else self.inputs.get(KERNEL_ERROR)

    def score(self, name: str, terms: tuple[ScoreTerm, ...] = ()) -> torch.Tensor:
        return ood_score(self.summary, name, self.inputs, terms)  # [N]

    def head(self, n: int) -> ScoreInputs:
        """The first ``n`` inputs' scores' sources (a threshold subset)."""
        summary = UncertaintySummary(**{f.name: getattr(self.summary, f.name)[:n] for f in fields(self.summary)})
        return ScoreInputs(summary, None if self.inputs is None else {k: v[:n] for k, v in self.inputs.items()})


@dataclass(frozen=True)
class Candidate:
    name: str  # a served score name (``models.uncertainty.SERVED_SCORES``)
    terms: tuple[ScoreTerm, ...] = ()


@dataclass(frozen=True)
class OodChoice:
    """The chosen score (``label`` names it in ``selection_auroc``), the fallback where it is undefined, and every
    candidate's validation AUROC. ``combined`` is the best combination (reported beside the others even when not
    chosen)."""

    label: str
    fallback_label: str
    candidates: dict[str, Candidate]
    selection_auroc: dict[str, float]  # label -> AUROC averaged over the OOD-validation families
    combined: str | None = None
    family_auroc: dict[str, dict[str, float]] = field(default_factory=dict)  # family -> label -> AUROC
    regret: dict[str, float] = field(default_factory=dict)  # label -> worst-case weighted regret over the families
    below_floor: dict[str, str] = field(default_factory=dict)  # label -> why it is not served (``FLOOR_RULE``)

    @property
    def chosen(self) -> Candidate:
        return self.candidates[self.label]

    @property
    def fallback(self) -> Candidate:
        return self.candidates[self.fallback_label]

    @property
    def terms(self) -> tuple[ScoreTerm, ...]:
        """The combination the served rules use (the chosen one's, else the fallback's; at most one is combined)."""
        return self.chosen.terms or self.fallback.terms

    def rule_at(self, n_samples: int) -> Candidate:
        """The served score at ``n_samples``: the chosen one unless it needs S >= 2 there."""
        return self.fallback if self.chosen.name == "mutual_information" and n_samples < 2 else self.chosen

    def reported(self) -> dict[str, Candidate]:
        """The scores a results table shows: the logit scores, the kernel error and the best combination."""
        return {label: c for label, c in self.candidates.items()
                if not label.startswith(COMBINED) or label == self.combined}


def combination_label(first: str, weight: float, second: str) -> str:
    return f"{COMBINED} ({first} w={weight:g} + {second})"


def standardised(values: torch.Tensor, name: str, weight: float, log: bool) -> ScoreTerm:
    """A term whose f(values) has mean 0 and std 1 on ``values`` (in-distribution validation) times ``weight``."""
    f = values.double().clamp_min(1e-30).log() if log else values.double()  # [N]
    return ScoreTerm(name, weight, float(f.mean()), max(float(f.std()), 1e-12), log)


def combination_pairs(given: list[str], logit_fallback: str) -> list[tuple[str, str]]:
    """The score pairs that are combined: the kernel error with the logit score and with each feature score, and
    each feature score with the logit score."""
    features = [n for n in FEATURE_SCORES if n in given]
    pairs = [(KERNEL_ERROR, logit_fallback), *((KERNEL_ERROR, f) for f in features)] if KERNEL_ERROR in given else []
    return pairs + [(f, logit_fallback) for f in features]


def choose_ood_score(val: ScoreInputs, families: Mapping[str, ScoreInputs], n_samples: int,
                     weights: Mapping[str, float] | None = None) -> OodChoice:
    """The candidate that generalises over the OOD-validation ``families`` (name -> that family's inputs): by
    ``SELECTION_RULE``, the lowest worst-case weighted regret, where a candidate's regret on a family is the best
    candidate's AUROC of ``val`` (in-distribution validation) against that family minus its own. With one family that
    is the highest AUROC."""
    if not families:
        raise ValueError("choosing an OOD score needs at least one OOD-validation family")
    weight = {name: float((weights or {}).get(name, 1.0)) for name in families}
    candidates = {n: Candidate(n) for n in OOD_SCORES if n_samples > 1 or n != "mutual_information"}
    table: dict[str, dict[str, float]] = {name: {} for name in families}  # family -> label -> AUROC

    def measure(labels: list[str]) -> None:
        for name, family in families.items():
            for label in labels:
                c = candidates[label]
                table[name][label] = auroc(val.score(c.name, c.terms), family.score(c.name, c.terms))

    measure(list(candidates))
    logit_fallback = generalising([n for n in candidates if n != "mutual_information"], table, weight)
    if val.inputs and all(family.inputs for family in families.values()):
        given = [n for n in INPUT_SCORES if n in val.inputs and all(n in f.inputs for f in families.values())]
        added = list(given)
        candidates.update({n: Candidate(n) for n in given})
        for first, second in combination_pairs(given, logit_fallback):
            for w in COMBINATION_WEIGHTS:
                terms = (standardised(val.score(first), first, w, log=first in LOG_SCALED),
                         standardised(val.score(second), second, 1.0 - w, log=second in LOG_SCALED))
                label = combination_label(first, w, second)
                candidates[label] = Candidate(COMBINED, terms)
                added.append(label)
        measure(added)
    labels = list(candidates)
    combinations = [label for label in labels if label.startswith(COMBINED)]
    below: dict[str, str] = {}
    allowed = above_floor(labels, candidates, val, families, table, weight, below)
    return OodChoice(
        label=allowed(labels),
        fallback_label=allowed([n for n in labels if n != "mutual_information"]),
        candidates=candidates,
        selection_auroc={label: mean_auroc(table, weight, label) for label in labels},
        combined=generalising(combinations, table, weight) if combinations else None,
        family_auroc=table,
        regret={label: worst_regret(table, weight, label) for label in labels},
        below_floor=below,
    )


def above_floor(labels: list[str], candidates: dict[str, Candidate], val: ScoreInputs,
                families: Mapping[str, ScoreInputs], table: dict[str, dict[str, float]], weight: Mapping[str, float],
                below: dict[str, str]) -> Callable[[list[str]], str]:
    """``generalising`` under ``FLOOR_RULE``: the rule's choice among ``labels``, skipping each candidate that is below
    max softmax beyond noise on some family (checked only when it would be chosen: the bootstrap is not free); why
    each skipped one was skipped goes into ``below``."""
    floor = candidates.get(FLOOR_SCORE)

    def check(label: str) -> str | None:
        if floor is None or label == FLOOR_SCORE:
            return None
        c = candidates[label]
        for offset, (name, family) in enumerate(families.items()):
            if weight[name] == 0 or table[name][label] >= table[name][FLOOR_SCORE]:  # weighted 0: does not count
                continue
            low, high = paired_ood_interval(auroc, val.score(c.name, c.terms), family.score(c.name, c.terms),
                                            val.score(floor.name), family.score(floor.name), FLOOR_BOOTSTRAP, offset)
            if high < 0:
                return (f"AUROC {table[name][label]:.3f} on {name} against max softmax's "
                        f"{table[name][FLOOR_SCORE]:.3f} (difference 95% interval [{low:+.3f}, {high:+.3f}])")
        return None

    def allowed(pool: list[str]) -> str:
        pool = [label for label in pool if label not in below]
        while True:
            label = generalising(pool, table, weight)
            reason = check(label)
            if reason is None:
                return label
            below[label] = reason
            pool = [other for other in pool if other != label]

    return allowed


def mean_auroc(table: dict[str, dict[str, float]], weight: Mapping[str, float], label: str) -> float:
    """``label``'s AUROC averaged over the families, each by its weight."""
    total = sum(weight.values())
    return sum(weight[f] * aurocs[label] for f, aurocs in table.items()) / total


def worst_regret(table: dict[str, dict[str, float]], weight: Mapping[str, float], label: str) -> float:
    """The largest weighted gap, over the families, between the best candidate's AUROC and ``label``'s."""
    return max(weight[f] * (max(aurocs.values()) - aurocs[label]) for f, aurocs in table.items())


def generalising(labels: list[str], table: dict[str, dict[str, float]], weight: Mapping[str, float]) -> str:
    """Among ``labels`` (simplest first), the one of lowest worst-case regret over the families (``SELECTION_RULE``);
    ties (to 1e-4) go to the higher mean AUROC, then to the simpler score."""
    return min(labels, key=lambda label: (round(worst_regret(table, weight, label), 4),
                                          -round(mean_auroc(table, weight, label), 4), labels.index(label)))


def returns_input_scores(model: torch.nn.Module) -> bool:
    """Whether an artifact-contract model (eager or scripted) returns per-input scores from ``scored_rows``: a DIRECTOR
    whose rollout carries the backbone's own last transitions (the kernel error; the feature-space scores too when it
    carries their statistics), or a post-hoc path (``models.posthoc``) that carries feature-space statistics."""
    if not hasattr(model, "scored_rows"):
        return False
    rollout = getattr(model, "rollout", None)
    if rollout is not None:
        return bool(getattr(rollout, "has_teacher", False))
    return bool(score_names(model))


def score_names(model: torch.nn.Module) -> tuple[str, ...]:
    """The columns of a model's ``scored_rows`` scores: a DIRECTOR's kernel error, then the feature scores it computes
    (all four, from an artifact scripted before ``FeatureScorer.keep`` existed); a post-hoc path's feature scores."""
    kernel = (KERNEL_ERROR,) if getattr(model, "rollout", None) is not None else ()
    scorer = getattr(model, "feature_scorer", None)
    if scorer is None or not hasattr(scorer, "bank"):
        return kernel
    return (*kernel, *served_scores(scorer))


def split_input_scores(model: torch.nn.Module, split: AnySplit, chunk: int = 256) -> InputScores | None:
    """The per-input scores ([N] each) of every input of ``split`` from an artifact-contract model's ``scored_rows``;
    None for a model without them (baselines, or a DIRECTOR without the teacher's transitions)."""
    if not returns_input_scores(model):
        return None

    def scores(*args: torch.Tensor) -> torch.Tensor:
        ones = torch.ones(args[0].shape[0], dtype=torch.long, device=args[0].device)  # [b] one row each
        values = model.scored_rows(*args, ones)[1].float().cpu()  # [b, F]
        return values.unsqueeze(1) if values.dim() == 1 else values

    table = split.map(scores, chunk)  # [N, F]
    return {name: table[:, i] for i, name in enumerate(score_names(model))}


@dataclass
class InputScoreCache:
    """The per-input scores of named sets under one model, each computed once."""

    model: torch.nn.Module
    values: dict[str, InputScores | None] = field(default_factory=dict)

    def __call__(self, name: str, split: AnySplit) -> InputScores | None:
        if name not in self.values:
            cache = draws.active()  # inside an export: the scores of a pass that drew the logits too
            self.values[name] = (split_input_scores(self.model, split) if cache is None
                                 else cache.input_scores(self.model, split, split_input_scores))
        return self.values[name]
