"""The task a classifier answers, decided once from its manifest or its run's config (pure torch, shared by training,
evaluation and the server): single-label (one softmax over the classes, ``models.uncertainty.summarize``) or
multi-label (an independent sigmoid per label: toxicity or topic taggers, Hugging Face's
``problem_type: multi_label_classification``).

Everything that differs between the two lives here: how S sampled logit rows become probabilities and uncertainty,
the per-input negative log-likelihood, the training loss and the teacher's soft targets. Labels are class indices
``[N]`` (int64) for a single-label task and 0/1 indicators ``[N, C]`` (float) for a multi-label one.

Multi-label maths, per label c and per input (all in nats): ``p_s = sigmoid(z_s / T)``, ``p = mean_s p_s``; the
predictive entropy ``H_b[p]`` (Bernoulli), the expected entropy ``mean_s H_b[p_s]``, and the mutual information their
difference clamped at 0. Per input the sums over labels: the entropy of the label vector read as independent
Bernoullis (a sum keeps the decomposition predictive = expected + mutual information exact). The top-level fields
keep their single-label names so drift, metrics and OOD scores read either task alike: ``confidence`` is the mean
over labels of ``max(p, 1 - p)`` (how sure each yes/no decision is), ``prediction`` the most probable label, and
``energy`` the joint energy ``-sum_c softplus(z_c)`` (Wang et al., 2021) averaged over samples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.nn import functional as F

from models.uncertainty import UncertaintySummary, summarize, tempered

SINGLE_LABEL = "single_label"
MULTI_LABEL = "multi_label"
TASKS = (SINGLE_LABEL, MULTI_LABEL)


@dataclass(frozen=True)
class MultiLabelSummary(UncertaintySummary):
    """``UncertaintySummary`` (its per-input fields the sums over labels) and, per label ``[B, C]``: the Bernoulli
    entropies and whether the label is predicted (its probability at or above its threshold)."""

    label_entropy: torch.Tensor
    label_expected_entropy: torch.Tensor
    label_mutual_information: torch.Tensor
    predicted: torch.Tensor  # [B, C] bool


def bernoulli_entropy(p: torch.Tensor) -> torch.Tensor:
    """H_b[p] = -p log p - (1 - p) log(1 - p) in nats, elementwise (0 at p = 0 or 1)."""
    p = p.double()
    return -(torch.special.xlogy(p, p) + torch.special.xlogy(1 - p, 1 - p))


def logit_entropy(z: torch.Tensor) -> torch.Tensor:
    """H_b[sigmoid(z)] from the logit, stably: softplus(z) - z * sigmoid(z)."""
    z = z.double()
    return F.softplus(z) - z * torch.sigmoid(z)


def _scaled(logits: torch.Tensor, temperature: float | torch.Tensor, label_temperatures: torch.Tensor | None
            ) -> torch.Tensor:
    """``logits [S, B, C]`` divided by one temperature or one per input ([B]), then by one per label ([C])."""
    z = tempered(logits, temperature)  # [S, B, C]
    if label_temperatures is not None:
        z = z / label_temperatures.to(z.device, torch.float32)[None, None, :]  # [S, B, C]
    return z


def summarize_multi_label(logits: torch.Tensor, temperature: float | torch.Tensor = 1.0,
                          label_temperatures: torch.Tensor | None = None, thresholds: torch.Tensor | None = None
                          ) -> MultiLabelSummary:
    """Summarise sampled logits ``[S, B, C]`` of a multi-label model (the module docstring's maths); ``thresholds``
    [C] decide the predicted labels (0.5 each when None)."""
    z = _scaled(logits, temperature, label_temperatures)  # [S, B, C]
    n_samples = z.shape[0]
    p_s = torch.sigmoid(z.double())  # [S, B, C]
    p = p_s.mean(0)  # [B, C]
    entropy = bernoulli_entropy(p)  # [B, C]
    expected = logit_entropy(z).mean(0)  # [B, C]
    mutual = torch.zeros_like(entropy) if n_samples == 1 else (entropy - expected).clamp_min(0.0)  # [B, C]
    cut = torch.full((p.shape[-1],), 0.5) if thresholds is None else thresholds
    predicted = p >= cut.to(p.device, torch.float64)[None, :]  # [B, C]
    top, prediction = p.max(dim=-1)  # [B], [B]
    return MultiLabelSummary(
        probabilities=p.float(), prediction=prediction, confidence=torch.maximum(p, 1 - p).mean(-1).float(),
        predictive_entropy=entropy.sum(-1).float(), expected_entropy=expected.sum(-1).float(),
        mutual_information=mutual.sum(-1).float(), energy=(-F.softplus(z).sum(-1)).mean(0).float(),
        label_entropy=entropy.float(), label_expected_entropy=expected.float(),
        label_mutual_information=mutual.float(), predicted=predicted)


@dataclass(frozen=True)
class SingleLabel:
    """One softmax over the classes; labels are class indices [N]."""

    kind: str = SINGLE_LABEL

    def summarize(self, logits: torch.Tensor, temperature: float | torch.Tensor = 1.0) -> UncertaintySummary:
        return summarize(logits, temperature)

    def per_input_nll(self, probs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """-log p(label) [N] of probabilities [N, C]."""
        return -probs.gather(1, labels.long()[:, None]).squeeze(1).clamp_min(1e-12).log()  # [N]

    def loss(self, logits: torch.Tensor, targets: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
        """Cross-entropy of logits [N, C] against class indices [N] or soft targets [N, C]."""
        return F.cross_entropy(logits.float(), targets, label_smoothing=label_smoothing)

    def soft_targets(self, logits: torch.Tensor) -> torch.Tensor:
        return logits.float().softmax(-1)  # [N, C]


@dataclass(frozen=True)
class MultiLabel:
    """A sigmoid per label; labels are 0/1 indicators [N, C]. ``label_temperatures`` (one per label) and
    ``thresholds`` (one per label) are the served calibration, from the manifest."""

    label_temperatures: torch.Tensor | None = None  # [C]
    thresholds: torch.Tensor | None = None  # [C]
    kind: str = MULTI_LABEL

    def summarize(self, logits: torch.Tensor, temperature: float | torch.Tensor = 1.0) -> MultiLabelSummary:
        return summarize_multi_label(logits, temperature, self.label_temperatures, self.thresholds)

    def per_input_nll(self, probs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Binary cross-entropy summed over labels [N] of probabilities [N, C] against indicators [N, C]."""
        p = probs.double().clamp(1e-12, 1 - 1e-12)  # [N, C]
        y = labels.to(p.device, torch.float64)  # [N, C]
        return -(y * p.log() + (1 - y) * (1 - p).log()).sum(-1)  # [N]

    def loss(self, logits: torch.Tensor, targets: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
        """Binary cross-entropy of logits [N, C] against indicators or soft targets [N, C], mean over inputs and
        labels (a smoothing pulls each target towards 1/2)."""
        y = targets.float()
        if label_smoothing:
            y = y * (1 - label_smoothing) + 0.5 * label_smoothing
        return F.binary_cross_entropy_with_logits(logits.float(), y)

    def soft_targets(self, logits: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(logits.float())  # [N, C]


Task = SingleLabel | MultiLabel


def task_for(kind: str, label_temperatures: list[float] | None = None, thresholds: list[float] | None = None
             ) -> Task:
    """The task of a manifest's or config's ``task`` (``TASKS``), with a multi-label model's calibration."""
    if kind == SINGLE_LABEL:
        return SingleLabel()
    if kind == MULTI_LABEL:
        as_tensor = lambda v: None if v is None else torch.tensor(v, dtype=torch.float32)  # noqa: E731
        return MultiLabel(as_tensor(label_temperatures), as_tensor(thresholds))
    raise ValueError(f"unknown task {kind!r}; choose from {TASKS}")


def max_label_entropy(num_labels: int) -> float:
    """The largest per-input (summed) entropy of ``num_labels`` Bernoullis: num_labels * log 2."""
    return num_labels * math.log(2.0)


SOFTMAX = SingleLabel()  # the default task wherever none is given: every model before multi-label ones
