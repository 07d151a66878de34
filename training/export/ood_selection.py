"""Which OOD score a model serves, chosen by AUROC of in-distribution validation against the OOD-validation set (never
a reported OOD set); the exporter and the evaluation choose with the same function (docs/method.md).

Candidates: every score of the sampled logits defined at the sample count (mutual information needs S >= 2); for a
DIRECTOR whose ``scored_rows`` returns per-input scores (the artifact carries the backbone's own last K transitions,
and maybe the feature-space statistics), each of those scores; and the combinations ``w * z(a) + (1 - w) * z(b)`` of
the pairs (kernel error, best logit score s defined at every S), (kernel error, feature score) and (feature score, s),
each z standardised on in-distribution validation (the log of the kernel error and of the Mahalanobis distance, which
span orders of magnitude), w in ``COMBINATION_WEIGHTS``. Ties go to the simpler score (logit scores first)."""

from __future__ import annotations

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
from training.ood_metrics import auroc

COMBINATION_WEIGHTS = (0.25, 0.5, 0.75)  # the first score's share of a combined score
LOG_SCALED = (KERNEL_ERROR, "mds")  # standardised on a log scale (positive, spanning orders of magnitude)

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
    selection_auroc: dict[str, float]
    combined: str | None = None

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


def choose_ood_score(val: ScoreInputs, ood_val: ScoreInputs, n_samples: int) -> OodChoice:
    """The candidate with the highest AUROC of ``val`` (in-distribution validation) against ``ood_val``."""
    candidates = {n: Candidate(n) for n in OOD_SCORES if n_samples > 1 or n != "mutual_information"}
    selection = {label: auroc(val.score(c.name), ood_val.score(c.name)) for label, c in candidates.items()}
    logit_fallback = max((n for n in selection if n != "mutual_information"), key=selection.get)
    combined = None
    if val.inputs and ood_val.inputs:
        given = [n for n in INPUT_SCORES if n in val.inputs and n in ood_val.inputs]
        candidates.update({n: Candidate(n) for n in given})
        for first, second in combination_pairs(given, logit_fallback):
            for weight in COMBINATION_WEIGHTS:
                terms = (standardised(val.score(first), first, weight, log=first in LOG_SCALED),
                         standardised(val.score(second), second, 1.0 - weight, log=second in LOG_SCALED))
                candidates[combination_label(first, weight, second)] = Candidate(COMBINED, terms)
        for label in list(candidates)[len(selection):]:
            c = candidates[label]
            selection[label] = auroc(val.score(c.name, c.terms), ood_val.score(c.name, c.terms))
        combinations = [label for label in selection if label.startswith(COMBINED)]
        combined = max(combinations, key=selection.get) if combinations else None
    label = max(selection, key=selection.get)
    fallback = max((n for n in selection if n != "mutual_information"), key=selection.get)
    return OodChoice(label, fallback, candidates, selection, combined)


def computes_kernel_error(model: torch.nn.Module) -> bool:
    """Whether an artifact-contract model (eager or scripted) returns per-input scores from ``scored_rows``: a DIRECTOR
    whose rollout carries the backbone's own last transitions (the kernel error; the feature-space scores too when it
    carries their statistics)."""
    rollout = getattr(model, "rollout", None)
    return hasattr(model, "scored_rows") and bool(getattr(rollout, "has_teacher", False))


def score_names(model: torch.nn.Module) -> tuple[str, ...]:
    """The columns of a DIRECTOR's ``scored_rows`` scores: the kernel error, then the feature scores it computes (all
    four, from an artifact scripted before ``FeatureScorer.keep`` existed)."""
    scorer = getattr(model, "feature_scorer", None)
    if scorer is None or not hasattr(scorer, "bank"):
        return (KERNEL_ERROR,)
    return (KERNEL_ERROR, *served_scores(scorer))


def split_input_scores(model: torch.nn.Module, split: AnySplit, chunk: int = 256) -> InputScores | None:
    """The per-input scores ([N] each) of every input of ``split`` from an artifact-contract model's ``scored_rows``;
    None for a model without them (baselines, or a DIRECTOR without the teacher's transitions)."""
    if not computes_kernel_error(model):
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
            self.values[name] = split_input_scores(self.model, split)
        return self.values[name]
