"""A multi-label version's post-hoc calibration, all on validation (never the test split): the temperature (one for
every label, or one per label), each label's decision threshold, the OOD score's thresholds and the reference
distributions for drift (docs/method.md, "Multi-label models")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from models.tasks import MultiLabel
from training.multi_label_metrics import fit_thresholds, label_ece, multi_label_report

LOG_GRID = torch.linspace(-1.5, 1.5, 31)  # log T, coarse; then a finer grid around the best


def label_nll(logits: torch.Tensor, labels: torch.Tensor, temperature: float) -> torch.Tensor:
    """Each label's mean binary NLL [C] of ``mean_s sigmoid(z_s / T)`` (logits [S, N, C], indicators [N, C])."""
    p = torch.sigmoid(logits.double() / temperature).mean(0).clamp(1e-12, 1 - 1e-12)  # [N, C]
    y = labels.double()  # [N, C]
    return -(y * p.log() + (1 - y) * (1 - p).log()).mean(0)  # [C]


def fit_label_temperatures(logits: torch.Tensor, labels: torch.Tensor, per_label: bool) -> list[float]:
    """The temperature minimising validation NLL: one for all labels (repeated C times) or each label's own; a
    search on log T (coarse grid, then a finer one around the best)."""
    coarse = torch.stack([label_nll(logits, labels, float(t.exp())) for t in LOG_GRID])  # [G, C]
    if not per_label:
        coarse = coarse.sum(1, keepdim=True).expand_as(coarse)  # [G, C]: every label the sum's choice
    chosen = []
    for c, best in enumerate(coarse.argmin(0).tolist()):
        centre = float(LOG_GRID[best])
        fine = torch.linspace(centre - 0.1, centre + 0.1, 21)
        column = [label_nll(logits, labels, float(t.exp())) for t in fine]  # each [C]
        score = [float(v.sum()) if not per_label else float(v[c]) for v in column]
        chosen.append(float(fine[min(range(len(fine)), key=score.__getitem__)].exp()))
    return chosen


def held_out_nll(logits: torch.Tensor, labels: torch.Tensor, temperatures: list[float]) -> float:
    """Mean per-input NLL (summed over labels) under per-label ``temperatures``."""
    probs = MultiLabel(torch.tensor(temperatures)).summarize(logits).probabilities  # [N, C]
    return float(MultiLabel().per_input_nll(probs, labels).mean())


@dataclass
class TemperatureChoice:
    temperature: float  # the manifest's temperature (dividing every logit)
    per_label: list[float] | None  # the manifest's multi_label.temperatures, when one per label was chosen
    rule: str
    fit: dict[str, Any]


def choose_temperature(logits: torch.Tensor, labels: torch.Tensor, mode: str, seed: int) -> TemperatureChoice:
    """``mode`` one / per_label, or auto: both fitted on one half of validation and compared on the other (NLL); the
    winner (per label only when it is lower) fitted again on all of validation."""
    if mode == "auto":
        order = torch.randperm(labels.shape[0], generator=torch.Generator().manual_seed(seed + 41))
        fit_rows, held_rows = order[: len(order) // 2], order[len(order) // 2:]
        held = {name: held_out_nll(logits[:, held_rows], labels[held_rows],
                                   fit_label_temperatures(logits[:, fit_rows], labels[fit_rows], per_label))
                for name, per_label in (("one", False), ("per_label", True))}
        mode = "per_label" if held["per_label"] < held["one"] else "one"
        fit: dict[str, Any] = {"held_out_nll": held, "rule": "auto: per label only when its held-out NLL is lower"}
    else:
        fit = {"rule": f"asked: {mode}"}
    temperatures = fit_label_temperatures(logits, labels, mode == "per_label")
    fit["validation_nll"] = held_out_nll(logits, labels, temperatures)
    if mode == "one":
        return TemperatureChoice(temperatures[0], None, "one", fit)
    return TemperatureChoice(1.0, temperatures, "per_label", fit)


@dataclass
class LabelCalibration:
    """What the manifest says of how the served probabilities and decisions are made."""

    temperature: TemperatureChoice
    thresholds: list[float]
    threshold_rule: str

    def task(self) -> MultiLabel:
        per_label = self.temperature.per_label
        return MultiLabel(None if per_label is None else torch.tensor(per_label), torch.tensor(self.thresholds))

    def probabilities(self, logits: torch.Tensor) -> torch.Tensor:
        """Served probabilities [N, C] of sampled logits [S, N, C]."""
        return self.task().summarize(logits, self.temperature.temperature).probabilities


def calibrate_labels(logits: torch.Tensor, labels: torch.Tensor, temperature_mode: str, threshold_rule: str,
                     seed: int) -> LabelCalibration:
    """The temperature, then each label's threshold on the calibrated validation probabilities."""
    temperature = choose_temperature(logits, labels, temperature_mode, seed)
    draft = LabelCalibration(temperature, [0.5] * labels.shape[1], threshold_rule)
    return LabelCalibration(temperature, fit_thresholds(draft.probabilities(logits), labels, threshold_rule),
                            threshold_rule)


def multi_label_reference(calibration: LabelCalibration, logits: torch.Tensor, labels: torch.Tensor,
                          ood: torch.Tensor, threshold: float) -> tuple[dict[str, Any], list[float]]:
    """The manifest's reference (validation metrics, the quantiles the drift gauges compare with, the OOD rate) and
    each label's validation ECE, under the served calibration."""
    summary = calibration.task().summarize(logits, calibration.temperature.temperature)
    report = multi_label_report(summary.probabilities, labels, calibration.thresholds)
    q = torch.linspace(0, 1, 101, dtype=torch.float64)
    deciles = torch.linspace(0.1, 0.9, 9, dtype=torch.float64)
    quantiles = lambda v, at=q: torch.quantile(v.double(), at).tolist()  # noqa: E731
    reference = {"split": "validation", "n_samples": int(logits.shape[0]), "n_inputs": int(labels.shape[0]),
                 **report, "quantile_levels": q.tolist(), "confidence_quantiles": quantiles(summary.confidence),
                 "predictive_entropy_quantiles": quantiles(summary.predictive_entropy),
                 "mutual_information_quantiles": quantiles(summary.mutual_information),
                 "confidence_deciles": quantiles(summary.confidence, deciles),
                 "ood_rate": float((ood > threshold).double().mean())}
    return reference, label_ece(summary.probabilities, labels)
