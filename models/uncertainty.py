"""Uncertainty summaries of sampled logits (pure torch, shared by training, evaluation and the server).

All entropies are in nats and computed in fp32 from log-softmax, never from ``log(softmax)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class UncertaintySummary:
    """Per-input summaries of ``S`` sampled logit rows; every field has shape ``[B]`` except
    ``probabilities`` (``[B, C]``)."""

    probabilities: torch.Tensor
    prediction: torch.Tensor
    confidence: torch.Tensor
    predictive_entropy: torch.Tensor
    expected_entropy: torch.Tensor
    mutual_information: torch.Tensor
    energy: torch.Tensor


def tempered(logits: torch.Tensor, temperature: float | torch.Tensor) -> torch.Tensor:
    """Sampled logits ``[S, B, C]`` in float32 divided by one temperature, or one per input (``[B]``)."""
    if logits.dim() != 3:
        raise ValueError(f"expected logits [S, B, C], got {tuple(logits.shape)}")
    if isinstance(temperature, torch.Tensor):
        if temperature.shape != logits.shape[1:2]:
            raise ValueError(f"expected one temperature per input [{logits.shape[1]}], got {tuple(temperature.shape)}")
        temperature = temperature.to(logits.device, torch.float32)[None, :, None]  # [1, B, 1]
    return logits.float() / temperature  # [S, B, C]


def summarize(logits: torch.Tensor, temperature: float | torch.Tensor = 1.0) -> UncertaintySummary:
    """Summarise sampled logits ``[S, B, C]``; the temperature divides every sample's logits first: one for all
    inputs, or one per input (``[B]``, a ``ScoreTemperature``'s)."""
    z = tempered(logits, temperature)  # [S, B, C]
    n_samples = z.shape[0]
    log_p_s = torch.log_softmax(z, dim=-1)  # [S, B, C]
    p_s = log_p_s.exp()  # [S, B, C]
    # log of the mean probability, stably: logsumexp over samples minus log S
    log_p = torch.logsumexp(log_p_s, dim=0) - torch.log(torch.tensor(float(n_samples)))  # [B, C]
    p = log_p.exp()  # [B, C]
    predictive_entropy = -(p * log_p).sum(-1)  # [B]
    expected_entropy = -(p_s * log_p_s).sum(-1).mean(0)  # [B]
    if n_samples == 1:
        mutual_information = torch.zeros_like(predictive_entropy)
    else:
        mutual_information = (predictive_entropy - expected_entropy).clamp_min(0.0)  # [B]
    confidence, prediction = p.max(dim=-1)  # [B], [B]
    energy = (-torch.logsumexp(z, dim=-1)).mean(0)  # [B]
    return UncertaintySummary(
        probabilities=p,
        prediction=prediction,
        confidence=confidence,
        predictive_entropy=predictive_entropy,
        expected_entropy=expected_entropy,
        mutual_information=mutual_information,
        energy=energy,
    )


def split_rows(rows: torch.Tensor, repeats: torch.Tensor) -> list[torch.Tensor]:
    """Split ``sample_rows`` output ``[sum(repeats), C]`` into one ``[S_i, 1, C]`` block per input."""
    blocks = torch.split(rows, repeats.tolist(), dim=0)
    return [block.unsqueeze(1) for block in blocks]


ECE_BINS = 15  # one binning for the evaluation, the manifest's reference and the server's live gauge


def expected_calibration_error(confidence: torch.Tensor, correct: torch.Tensor, bins: int = ECE_BINS) -> float:
    """ECE of top-label ``confidence`` [N] against ``correct`` [N] (bool or 0/1): equal-width bins (a confidence on a
    bin edge belongs to the lower bin, as in torchmetrics), sum over bins of |accuracy - mean confidence| x share."""
    confidence = confidence.detach().double().reshape(-1).cpu()  # [N]
    correct = correct.detach().double().reshape(-1).cpu()  # [N]
    if confidence.numel() == 0:
        return 0.0
    edges = torch.linspace(0, 1, bins + 1, dtype=torch.float64)  # [bins + 1]
    index = (torch.bucketize(confidence, edges, right=True) - 1).clamp(0, bins - 1)  # [N]
    conf_sum = torch.zeros(bins, dtype=torch.float64).index_add_(0, index, confidence)  # [bins]
    correct_sum = torch.zeros(bins, dtype=torch.float64).index_add_(0, index, correct)  # [bins]
    return float((conf_sum - correct_sum).abs().sum() / confidence.numel())


OOD_SCORES = ("max_softmax", "predictive_entropy", "mutual_information", "energy")  # from sampled logits
KERNEL_ERROR = "kernel_error"  # from the rollout: an artifact's ``scored_rows`` returns it per input
# on the backbone's penultimate features (models.feature_scores); mds_pp is Mahalanobis++
FEATURE_SCORES = ("mds", "rmds", "knn", "vim", "mds_pp")
INPUT_SCORES = (KERNEL_ERROR, *FEATURE_SCORES)  # one value per input whatever the sample count: scored_rows' columns
COMBINED = "combined"  # a weighted sum of standardised scores (``ScoreTerm``), e.g. energy and the kernel error
SERVED_SCORES = (*OOD_SCORES, *INPUT_SCORES, COMBINED)


@dataclass(frozen=True)
class ScoreTerm:
    """One term of a combined score: ``weight * (f(score) - center) / scale`` with f = log when ``log`` (the kernel
    error spans orders of magnitude) and the identity otherwise; center and scale are the in-distribution validation
    mean and std of f(score), so terms on different scales add up."""

    score: str
    weight: float
    center: float
    scale: float
    log: bool = False

    def __call__(self, values: torch.Tensor) -> torch.Tensor:
        values = values.float().clamp_min(1e-30).log() if self.log else values.float()  # [B]
        return self.weight * (values - self.center) / self.scale  # [B]


def ood_score(summary: UncertaintySummary, name: str, inputs: Mapping[str, torch.Tensor] | None = None,
              terms: tuple[ScoreTerm, ...] = ()) -> torch.Tensor:
    """One OOD score per input, higher = more out-of-distribution. ``inputs`` maps the per-input scores an artifact's
    ``scored_rows`` returned (``INPUT_SCORES``: the kernel error, the feature-space scores) to [B] each: needed by
    those scores and by combined scores using them; ``terms`` define ``combined``."""
    if name == "max_softmax":
        return 1.0 - summary.confidence
    if name == "predictive_entropy":
        return summary.predictive_entropy
    if name == "mutual_information":
        return summary.mutual_information
    if name == "energy":
        return summary.energy
    if name in INPUT_SCORES:
        if inputs is None or name not in inputs:
            raise ValueError(f"the {name} score is computed per input by the artifact's scored_rows, which gave "
                             f"{sorted(inputs or {})}")
        return inputs[name].float()
    if name == COMBINED:
        if not terms or any(term.score == COMBINED for term in terms):
            raise ValueError("a combined score needs terms, none of them combined")
        return torch.stack([term(ood_score(summary, term.score, inputs)) for term in terms]).sum(0)  # [B]
    raise ValueError(f"unknown OOD score {name!r}; choose from {SERVED_SCORES}")


@dataclass(frozen=True)
class ScoreTemperature:
    """A temperature per input that grows with how far off-distribution the input looks:
    ``base * exp(slope * max(0, z))``, z the sum of standardised per-input score terms (the served OOD score's, 0 at
    the in-distribution validation mean). Inputs that look like validation keep ``base``; shifted ones get softer
    probabilities. The slope is fitted post hoc on validation and a held-out shift (docs/method.md, "A temperature
    that follows the OOD score"). Its terms read only ``scored_rows``' per-input scores, never the logits it divides."""

    base: float
    slope: float
    terms: tuple[ScoreTerm, ...]

    def __post_init__(self) -> None:
        if not self.terms or any(term.score not in INPUT_SCORES for term in self.terms):
            raise ValueError(f"a score temperature reads per-input scores only ({INPUT_SCORES}), got "
                             f"{[term.score for term in self.terms]}")

    def __call__(self, inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        z = torch.stack([term(inputs[term.score]) for term in self.terms]).sum(0)  # [B]
        return self.base * torch.exp(self.slope * z.clamp_min(0.0))  # [B]


Temperature = float | ScoreTemperature  # what a served model divides its logits by


def temperature_for(temperature: Temperature, inputs: Mapping[str, torch.Tensor] | None) -> float | torch.Tensor:
    """The temperature ``summarize`` takes: the scalar itself, or a score temperature's value per input ([B]) from
    ``scored_rows``' per-input scores."""
    if isinstance(temperature, ScoreTemperature):
        if inputs is None:
            raise ValueError("a score temperature needs the per-input scores of the artifact's scored_rows")
        return temperature(inputs)
    return temperature


def needs_input_scores(name: str, terms: tuple[ScoreTerm, ...] = ()) -> bool:
    """Whether the score ``name`` (with its ``terms``) reads a per-input score of ``scored_rows``."""
    return name in INPUT_SCORES or (name == COMBINED and any(term.score in INPUT_SCORES for term in terms))
