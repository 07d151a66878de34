"""The decisions stage: prediction sets and abstentions measured as a served version gives them (docs/method.md,
"Acting on uncertainty: prediction sets and abstentions"), for DIRECTOR, the post-hoc path and temperature scaling.

Each method is calibrated on the calibration split the export carves off (``training.data.calibration_split``), with
the export's own tables (``models.conformal``) and thresholds (``models.selective``), then measured where
exchangeability holds (the test split) and where it breaks (every shift level, the OOD sets):

- empirical coverage and mean set size at each of ``COVERAGES``, per conformal score;
- selective risk and the share answered at each of ``RISKS``, with the Learn-then-Test threshold, on the test split
  and per shift level, and the risk-coverage curve the thresholds sit on;
- the shift-normalised variant: every nonconformity score divided by ``exp(gamma * z)``, ``z`` the input's OOD score
  standardised on the calibration split and clipped at 0, so an input that looks unlike the calibration inputs gets a
  wider set. Calibrated the same way, so its test guarantee is unchanged; ``gamma`` is chosen on the held-out shift
  (``training.data.held_out_shift``), never on a reported set: the smallest in ``GAMMAS`` whose coverage there at 0.9
  reaches 0.9, or the one that comes closest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from tqdm import tqdm

from models.conformal import ScoreRule, conformal_threshold, label_scores, set_figures
from models.selective import answered_risk, learn_then_test
from training.data.held_out_shift import held_out_shift
from training.evaluate.evaluation import HYBRID, POSTHOC, Evaluation, Method, summary_of
from training.evaluate.sets import shift_sets
from training.loading import AnySplit
from training.posthoc.conformal import score_rules
from training.posthoc.decision_figures import COVERAGES, RISKS
from training.posthoc.ood_selection import ScoreInputs

GAMMAS = (0.0, 0.25, 0.5, 1.0, 2.0)
GAMMA_COVERAGE = 0.9  # the level the variant's gamma is chosen at
CURVE_POINTS = 60  # points kept of each risk-coverage curve


def decided_methods(methods: list[Method]) -> list[Method]:
    """Temperature scaling, the post-hoc path, the hybrid, DIRECTOR at its evaluated S, and the version as served when
    the evaluation has one."""
    director = [m for m in methods if m.family == "director" and m.key.startswith("director_s")
                and m.key.removeprefix("director_s").isdigit() and m.n_samples > 1]
    keys = {"temperature_scaling", POSTHOC, HYBRID, "posthoc_served", "hybrid_served", "director_served",
            *(m.key for m in director)}
    return [m for m in methods if m.key in keys]


@dataclass(frozen=True)
class Scored:
    """A method's served probabilities and its own OOD score (from ``test_and_ood``) on some inputs."""

    probs: torch.Tensor  # [N, C]
    ood: torch.Tensor  # [N] float64

    @classmethod
    def of(cls, evaluation: Evaluation, method: Method, set_name: str, split: AnySplit) -> Scored:
        native = evaluation.native_scores(method, set_name, split)
        summary = summary_of(evaluation.logits(method.source, set_name, split), method, native)
        rule, _ = evaluation.flag_rules[method.key]
        return cls(summary.probabilities, ScoreInputs(summary, native).score(rule.name, rule.terms).double())

    @classmethod
    def joined(cls, parts: list[Scored]) -> Scored:
        return cls(torch.cat([p.probs for p in parts]), torch.cat([p.ood for p in parts]))


class Calibrated:
    """One method's sets and abstentions as its version would serve them, fitted on the calibration split."""

    def __init__(self, calibration: Scored, labels: torch.Tensor, rules: dict[str, ScoreRule], delta: float) -> None:
        self.rules, self.labels = rules, labels
        self.calibration = calibration
        self.center = float(calibration.ood.mean())
        self.spread = float(calibration.ood.std()) or 1.0
        confidence, prediction = calibration.probs.max(dim=1)  # [n] each
        self.selective = {risk: learn_then_test(confidence, prediction == labels, risk, delta) for risk in RISKS}

    def widening(self, scored: Scored, gamma: float) -> torch.Tensor:
        """Each input's divisor ``exp(gamma * max(z, 0))`` ``[N]``."""
        z = ((scored.ood - self.center) / self.spread).clamp_min(0.0)  # [N]
        return torch.exp(gamma * z)

    def included(self, scored: Scored, score: str, coverage: float, gamma: float = 0.0) -> torch.Tensor:
        """Which labels each input's set keeps ``[N, C]`` (bool)."""
        rule = self.rules[score]
        calibration = label_scores(self.calibration.probs, rule).gather(1, self.labels[:, None]).squeeze(1)  # [n]
        calibration = (calibration / self.widening(self.calibration, gamma)).sort().values  # [n] ascending
        threshold = conformal_threshold(calibration, coverage)
        return label_scores(scored.probs, rule) / self.widening(scored, gamma)[:, None] <= threshold  # [N, C]


def selective_figures(fit: Calibrated, scored: Scored, labels: torch.Tensor) -> dict[str, dict[str, Any]]:
    """Per risk level: the threshold, the share answered and the error rate among answered inputs."""
    confidence, prediction = scored.probs.max(dim=1)  # [N] each
    wrong = prediction != labels  # [N]
    return {f"{risk:g}": answered_risk(rule.threshold, confidence, wrong) for risk, rule in fit.selective.items()}


def risk_curve(scored: Scored, labels: torch.Tensor) -> dict[str, list[float]]:
    """The error rate of the most confident inputs against their share, ``CURVE_POINTS`` points."""
    confidence, prediction = scored.probs.max(dim=1)  # [N] each
    errors = (prediction != labels)[confidence.argsort(descending=True)].double()  # [N]
    kept = torch.arange(1, len(errors) + 1, dtype=torch.float64)  # [N]
    picks = torch.linspace(0, len(errors) - 1, CURVE_POINTS).round().long()  # [P]
    return {"answered": (kept / len(errors))[picks].tolist(), "risk": (errors.cumsum(0) / kept)[picks].tolist()}


def choose_gamma(fit: Calibrated, shifted: Scored, labels: torch.Tensor, score: str) -> dict[str, Any]:
    """The variant's ``gamma``: coverage at ``GAMMA_COVERAGE`` on the held-out shift for each grid point."""
    coverage = {g: set_figures(fit.included(shifted, score, GAMMA_COVERAGE, g), labels)["coverage"] for g in GAMMAS}
    reaching = [g for g in GAMMAS if coverage[g] >= GAMMA_COVERAGE]
    gamma = min(reaching) if reaching else max(GAMMAS, key=lambda g: coverage[g])
    return {"gamma": gamma, "held_out_coverage": {f"{g:g}": c for g, c in coverage.items()}}


def every_set(fit: Calibrated, scored: Scored, labels: torch.Tensor | None, gamma: float = 0.0) -> dict[str, Any]:
    """Set figures per conformal score and coverage level."""
    return {score: {f"{c:g}": set_figures(fit.included(scored, score, c, gamma), labels) for c in COVERAGES}
            for score in fit.rules}


def evaluate_decisions(evaluation: Evaluation, methods: list[Method]) -> dict[str, Any]:
    """Per decided method: the test split, each shift level (pooled over its corruption types, or one per domain) and
    each OOD set, plain and shift-normalised (``gamma``); the risk-coverage curve and the selective figures."""
    cfg, inputs = evaluation.cfg, evaluation.inputs
    if inputs.calibration is None:
        raise ValueError("the decisions stage needs a calibration split: set export.calibration_share above 0")
    rules = score_rules(cfg.export.conformal_scores, cfg.export.raps_penalty, cfg.export.raps_free_ranks)
    clean = inputs.val.head(cfg.evaluate.noise_fit_images)
    held_out = held_out_shift(cfg, clean)
    held_out_name = f"held-out-shift-{evaluation.cache_name('val')}-n{len(clean)}"
    shifted_sets = shift_sets(cfg, inputs) if "shift" in cfg.evaluate.stages else []
    out: dict[str, Any] = {"coverages": list(COVERAGES), "risks": list(RISKS),
                           "default_score": cfg.export.conformal_scores[0],
                           "calibration_inputs": len(inputs.calibration), "delta": cfg.export.selective_delta,
                           "held_out_shift": held_out.description, "methods": {}}
    for method in tqdm(decided_methods(methods), desc="decisions", leave=False):
        fit = Calibrated(Scored.of(evaluation, method, "calibration", inputs.calibration), inputs.calibration.labels,
                         rules, cfg.export.selective_delta)
        variant = choose_gamma(fit, Scored.of(evaluation, method, held_out_name, held_out.split),
                               held_out.split.labels, out["default_score"])
        test = Scored.of(evaluation, method, "test", inputs.test)
        out["methods"][method.key] = {
            "label": method.label, "variant": variant,
            "test": {"sets": every_set(fit, test, inputs.test.labels),
                     "sets_normalised": every_set(fit, test, inputs.test.labels, variant["gamma"]),
                     "selective": selective_figures(fit, test, inputs.test.labels),
                     "curve": risk_curve(test, inputs.test.labels)},
            "ood": {name: every_set(fit, Scored.of(evaluation, method, name, split), None)
                    for name, split in inputs.ood.items()},
            "shift": shift_levels(evaluation, method, fit, shifted_sets, out["default_score"], variant["gamma"]),
        }
    return out


def shift_levels(evaluation: Evaluation, method: Method, fit: Calibrated, shifted_sets: list[Any], score: str,
                 gamma: float) -> dict[str, Any]:
    """Per shift level (a severity pooled over corruption types, or a domain): coverage and set size at every level
    of ``COVERAGES`` with the default score, plain and shift-normalised, and the selective figures."""
    pooled: dict[str, list[tuple[Scored, torch.Tensor]]] = {}  # level -> (scored, labels [N]) per set
    for shifted in shifted_sets:
        level = shifted.group if shifted.level is None else str(shifted.level)
        pooled.setdefault(level, []).append((Scored.of(evaluation, method, shifted.set_name, shifted.split),
                                             shifted.split.labels))
    out: dict[str, Any] = {}
    for level, parts in pooled.items():
        scored = Scored.joined([part for part, _ in parts])
        labels = torch.cat([labels for _, labels in parts])  # [N]
        out[level] = {"n": len(labels),
                      **{name: {f"{c:g}": set_figures(fit.included(scored, score, c, g), labels) for c in COVERAGES}
                         for name, g in (("sets", 0.0), ("sets_normalised", gamma))},
                      "selective": selective_figures(fit, scored, labels)}
    return out
