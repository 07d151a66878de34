"""Which OOD score a model serves, chosen by AUROC of in-distribution validation against the OOD-validation set (never
a reported OOD set); the exporter and the evaluation choose with the same function (docs/method.md).

Candidates: every score of the sampled logits defined at the sample count (mutual information needs S >= 2) and, for
a DIRECTOR whose kernel error is known (``scored_rows``: the artifact carries the backbone's own last K transitions),
the kernel error and its combinations ``w * z(log kernel error) + (1 - w) * z(s)`` with the best logit score s that is
defined at every S, each z standardised on in-distribution validation, w in ``COMBINATION_WEIGHTS``. Ties go to the
simpler score (logit scores first)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch

from models.uncertainty import COMBINED, KERNEL_ERROR, OOD_SCORES, ScoreTerm, UncertaintySummary, ood_score
from training.loading import AnySplit
from training.ood_metrics import auroc

COMBINATION_WEIGHTS = (0.25, 0.5, 0.75)  # the kernel error's share of a combined score


@dataclass(frozen=True)
class ScoreInputs:
    """What a set's OOD scores are computed from: its summary and, for a DIRECTOR, its kernel error [N]."""

    summary: UncertaintySummary
    kernel_error: torch.Tensor | None = None

    def score(self, name: str, terms: tuple[ScoreTerm, ...] = ()) -> torch.Tensor:
        return ood_score(self.summary, name, self.kernel_error, terms)  # [N]

    def head(self, n: int) -> ScoreInputs:
        """The first ``n`` inputs' scores' sources (a threshold subset)."""
        summary = UncertaintySummary(**{f.name: getattr(self.summary, f.name)[:n] for f in fields(self.summary)})
        return ScoreInputs(summary, None if self.kernel_error is None else self.kernel_error[:n])


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


def combination_label(weight: float) -> str:
    return f"{COMBINED} (kernel_error w={weight:g})"


def standardised(values: torch.Tensor, name: str, weight: float, log: bool) -> ScoreTerm:
    """A term whose f(values) has mean 0 and std 1 on ``values`` (in-distribution validation) times ``weight``."""
    f = values.double().clamp_min(1e-30).log() if log else values.double()  # [N]
    return ScoreTerm(name, weight, float(f.mean()), max(float(f.std()), 1e-12), log)


def choose_ood_score(val: ScoreInputs, ood_val: ScoreInputs, n_samples: int) -> OodChoice:
    """The candidate with the highest AUROC of ``val`` (in-distribution validation) against ``ood_val``."""
    candidates = {n: Candidate(n) for n in OOD_SCORES if n_samples > 1 or n != "mutual_information"}
    selection = {label: auroc(val.score(c.name), ood_val.score(c.name)) for label, c in candidates.items()}
    logit_fallback = max((n for n in selection if n != "mutual_information"), key=selection.get)
    combined = None
    if val.kernel_error is not None and ood_val.kernel_error is not None:
        candidates[KERNEL_ERROR] = Candidate(KERNEL_ERROR)
        for weight in COMBINATION_WEIGHTS:
            terms = (standardised(val.kernel_error, KERNEL_ERROR, weight, log=True),
                     standardised(val.score(logit_fallback), logit_fallback, 1.0 - weight, log=False))
            candidates[combination_label(weight)] = Candidate(COMBINED, terms)
        for label in list(candidates)[len(selection):]:
            c = candidates[label]
            selection[label] = auroc(val.score(c.name, c.terms), ood_val.score(c.name, c.terms))
        combined = max((label for label in selection if label.startswith(COMBINED)), key=selection.get)
    label = max(selection, key=selection.get)
    fallback = max((n for n in selection if n != "mutual_information"), key=selection.get)
    return OodChoice(label, fallback, candidates, selection, combined)


def computes_kernel_error(model: torch.nn.Module) -> bool:
    """Whether an artifact-contract model (eager or scripted) returns the kernel error from ``scored_rows``: a DIRECTOR
    whose rollout carries the backbone's own last transitions."""
    rollout = getattr(model, "rollout", None)
    return hasattr(model, "scored_rows") and bool(getattr(rollout, "has_teacher", False))


def split_kernel_error(model: torch.nn.Module, split: AnySplit, chunk: int = 256) -> torch.Tensor | None:
    """The kernel error [N] of every input of ``split`` from an artifact-contract model's ``scored_rows``; None for a
    model without one (baselines, or a DIRECTOR without the teacher's transitions)."""
    if not computes_kernel_error(model):
        return None

    def errors(*args: torch.Tensor) -> torch.Tensor:
        ones = torch.ones(args[0].shape[0], dtype=torch.long, device=args[0].device)  # [b] one row each
        return model.scored_rows(*args, ones)[1].float().cpu()  # [b]

    return split.map(errors, chunk)  # [N]


@dataclass
class KernelErrorCache:
    """The kernel error of named sets under one model, each computed once."""

    model: torch.nn.Module
    values: dict[str, torch.Tensor | None] = field(default_factory=dict)

    def __call__(self, name: str, split: AnySplit) -> torch.Tensor | None:
        if name not in self.values:
            self.values[name] = split_kernel_error(self.model, split)
        return self.values[name]
