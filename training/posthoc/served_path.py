"""One served path of an export (docs/method.md, "The kernel earns its place, or steps aside"): DIRECTOR as it would
be served, or the post-hoc path, each given the same post-hoc tools by the same rules on the same validation data:
the served temperature, a temperature per input that follows the OOD score, the OOD score chosen over the
OOD-validation families, its thresholds and the reference distributions (``training.posthoc.served_statistics``).
The verdict (``training.export.verdict``) compares the two; the version serves one."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from models.uncertainty import ScoreTemperature, Temperature, summarize, temperature_for
from training.config import PipelineConfig
from training.data.held_out_shift import HeldOutShift
from training.data.ood_families import OodFamily
from training.loading import AnySplit
from training.posthoc.ood_selection import ScoreInputs
from training.posthoc.served_statistics import (
    ServedStatistics,
    fit_temperature_slope,
    reference_section,
    sample_split,
    served_statistics,
    served_temperature,
    temperature_on_shift,
    temperature_terms,
)


def temperature_draws(served: torch.nn.Module, val: AnySplit, cfg: PipelineConfig, default_s: int
                      ) -> torch.Tensor | None:
    """The validation draws [S, N, C] at the default S that the served temperature and its slope are fitted on (a
    seed of their own), or None when neither is fitted."""
    ecfg = cfg.export
    if not ecfg.temperature_scaling and not any(ecfg.temperature_slope_grid):
        return None
    return sample_split(served, val, default_s, cfg.seed + 2)  # [S, N, C]


def choose_temperature(served: torch.nn.Module, val: AnySplit, cfg: PipelineConfig, default_s: int,
                       shift: HeldOutShift | None, clean: torch.Tensor | None) -> tuple[float, dict[str, float]]:
    """The served temperature on the sampled logits ``clean`` (``temperature_draws``): kept when it wins on held-out
    validation (else 1), and, when the noise was shaped on the held-out ``shift``, when it does not undo that there
    (``temperature_on_shift``)."""
    ecfg, seed = cfg.export, cfg.seed
    if not ecfg.temperature_scaling or clean is None:
        return 1.0, {}
    temperature, record = served_temperature(clean, val.labels)
    if shift is None or temperature == 1.0:
        return temperature, record
    shifted = sample_split(served, shift.split, default_s, seed + 2)  # [S, N', C]
    kept, on_shift = temperature_on_shift(temperature, clean, val.labels, shifted, shift.split.labels)
    return kept, {**record, **on_shift, "temperature_clean": temperature}


@dataclass
class ScoreTemperatureFit:
    temperature: ScoreTemperature | None  # None: the fit kept one temperature (slope 0)
    record: dict[str, Any]  # the slope, the terms, what it was fitted on, every slope's figures


def choose_temperature_by_score(served: torch.nn.Module, val: AnySplit, cfg: PipelineConfig, default_s: int,
                                temperature: float, stats: ServedStatistics, clean: torch.Tensor | None,
                                shift: HeldOutShift) -> ScoreTemperatureFit | None:
    """A temperature per input that grows with the served OOD score, when ``export.temperature_slope_grid`` offers
    slopes: fitted on validation and its held-out ``shift`` (``fit_temperature_slope``), served when its slope is
    above 0 (the reference distributions are then measured again under it). None when no slope is offered; not fitted
    when the served score reads the logits (``temperature_terms``)."""
    ecfg, seed = cfg.export, cfg.seed
    if not any(ecfg.temperature_slope_grid) or clean is None:
        return None
    val_scores = stats.input_scores("val", val)
    terms = temperature_terms(stats.choice, default_s, val_scores or {})
    if val_scores is None or not terms:
        return ScoreTemperatureFit(None, {"slope": 0.0, "not_fitted": "the served OOD score reads the logits, which "
                                          "the temperature divides (or the model returns no per-input scores)"})
    shifted = sample_split(served, shift.split, default_s, seed + 2)  # [S, N', C]
    shift_scores = stats.input_scores("held_out_shift", shift.split)
    assert shift_scores is not None  # the served module returned val's
    slope, table = fit_temperature_slope(temperature, terms, sorted({0.0, *ecfg.temperature_slope_grid}), clean,
                                         val.labels, val_scores, shifted, shift.split.labels, shift_scores)
    record = {"slope": slope, "terms": [dataclasses.asdict(term) for term in terms],
              "fitted_on": shift.description, "fit": table}
    if slope == 0.0:
        return ScoreTemperatureFit(None, record)
    by_score = ScoreTemperature(temperature, slope, terms)
    reference = reference_section(summarize(stats.val_logits, by_score(val_scores)), val.labels, default_s)
    stats.reference = {**reference, "ood_rate": stats.reference["ood_rate"]}  # the OOD score reads no logits
    return ScoreTemperatureFit(by_score, record)


@dataclass
class ServedPath:
    """One path as it would be served: its modules, default S, temperature rule and statistics."""

    method: str  # "director" | "posthoc"
    module: torch.nn.Module  # the eager artifact module
    served: torch.jit.ScriptModule  # the scripted file the statistics were measured on
    default_samples: int
    temperature: float
    temperature_fit: dict[str, Any]
    by_score: ScoreTemperatureFit | None
    stats: ServedStatistics

    @property
    def rule(self) -> Temperature:
        """The served temperature: one, or a ``ScoreTemperature`` per input."""
        return self.by_score.temperature if self.by_score and self.by_score.temperature else self.temperature

    def inputs(self, name: str, split: AnySplit, seed: int) -> ScoreInputs:
        """What this path serves on ``split`` (``name`` caches its per-input scores): its probabilities under its
        temperature rule and its per-input scores."""
        logits = sample_split(self.served, split, self.default_samples, seed)  # [S, N, C] (and the scores, once)
        scores = self.stats.input_scores(name, split)
        return ScoreInputs(summarize(logits, temperature_for(self.rule, scores)), scores)

    def val_inputs(self, split: AnySplit) -> ScoreInputs:
        """``inputs`` on validation from the draws the reference was measured on."""
        scores = self.stats.input_scores("val", split)
        return ScoreInputs(summarize(self.stats.val_logits, temperature_for(self.rule, scores)), scores)

    def family_inputs(self, name: str, split: AnySplit) -> ScoreInputs:
        """``inputs`` on the OOD-validation family ``name`` from the draws its score was chosen on."""
        scores = self.stats.input_scores(f"ood_validation:{name}", split)
        return ScoreInputs(summarize(self.stats.family_logits[name], temperature_for(self.rule, scores)), scores)

    def ood_score(self, inputs: ScoreInputs) -> torch.Tensor:
        """The served OOD score at the default S [N]."""
        rule = self.stats.choice.rule_at(self.default_samples)
        return inputs.score(rule.name, rule.terms)


def fit_served_path(method: str, module: torch.nn.Module, served: torch.nn.Module, val: AnySplit,
                    families: dict[str, OodFamily], cfg: PipelineConfig, default_s: int, sample_counts: list[int],
                    shift: HeldOutShift, noise_shift: HeldOutShift | None) -> ServedPath:
    """The post-hoc tools of one path, fitted on validation and its held-out ``shift``: the served temperature (which
    also answers to ``noise_shift``, the shift DIRECTOR's noise was shaped on, when it was), the statistics and OOD
    score, then a temperature per input."""
    ecfg = cfg.export
    clean = temperature_draws(served, val, cfg, default_s)
    temperature, temperature_fit = choose_temperature(served, val, cfg, default_s, noise_shift, clean)
    stats = served_statistics(served, val, ecfg, sample_counts, default_s, cfg.seed, families,
                              temperature)
    by_score = choose_temperature_by_score(served, val, cfg, default_s, temperature, stats, clean, shift)
    if by_score is not None:  # kept or not, the slope's fit is recorded
        temperature_fit = {**temperature_fit, "by_score": by_score.record}
    return ServedPath(method, module, served, default_s, temperature, temperature_fit, by_score, stats)
