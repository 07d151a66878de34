"""The decisions stage's measurements on simulated exchangeable data, against the served tables
(``models.conformal``, ``models.selective``) they must reproduce."""

from __future__ import annotations

import torch

from models.conformal import ConformalTable, ScoreRule
from training.evaluate.decisions import (
    GAMMA_COVERAGE,
    RISKS,
    Calibrated,
    Scored,
    choose_gamma,
    risk_curve,
    selective_figures,
    set_figures,
)
from training.posthoc.conformal import score_rules

RULES = score_rules(["aps", "lac"], 0.01, 1)


def simulated(n: int, classes: int, seed: int, ood_shift: float = 0.0, sharpness: float = 2.5
              ) -> tuple[Scored, torch.Tensor]:
    """Probabilities with labels drawn from them (calibrated by construction) and an OOD score; ``ood_shift`` raises
    the OOD score and flattens nothing, so only the normalised variant reacts to it."""
    generator = torch.Generator().manual_seed(seed)
    logits = sharpness * torch.randn(n, classes, generator=generator)  # [n, C]
    probs = logits.softmax(dim=1)  # [n, C]
    labels = torch.multinomial(probs, 1, generator=generator).squeeze(1)  # [n]
    ood = torch.randn(n, generator=generator, dtype=torch.float64) + ood_shift  # [n]
    return Scored(probs, ood), labels


def test_plain_sets_are_the_served_tables_sets() -> None:
    calibration, labels = simulated(500, 6, seed=0)
    test, _ = simulated(300, 6, seed=1)
    fit = Calibrated(calibration, labels, RULES, delta=0.1)
    for name, rule in RULES.items():
        served = ConformalTable.fit(calibration.probs, labels, rule).sets(test.probs, 0.9)
        mine = fit.included(test, name, 0.9)  # [N, C]
        assert [sorted(s) for s in served] == [sorted(torch.nonzero(row).squeeze(1).tolist()) for row in mine]


def test_coverage_holds_on_exchangeable_inputs_and_grows_with_the_target() -> None:
    calibration, labels = simulated(2000, 6, seed=2)
    test, test_labels = simulated(4000, 6, seed=3)
    fit = Calibrated(calibration, labels, RULES, delta=0.1)
    figures = [set_figures(fit.included(test, "aps", c), test_labels) for c in (0.8, 0.9, 0.95, 0.99)]
    for target, got in zip((0.8, 0.9, 0.95, 0.99), figures, strict=True):
        assert abs(got["coverage"] - target) < 4 * got["coverage_se"] + 0.01
    sizes = [f["mean_size"] for f in figures]
    assert sizes == sorted(sizes) and sizes[0] >= 1.0
    assert set(set_figures(fit.included(test, "aps", 0.9), None)) == {"mean_size"}  # no labels: no coverage


def test_the_normalised_variant_widens_sets_where_the_ood_score_is_high() -> None:
    calibration, labels = simulated(1000, 6, seed=4)
    fit = Calibrated(calibration, labels, RULES, delta=0.1)
    shifted, shifted_labels = simulated(1000, 6, seed=5, ood_shift=3.0)
    plain = set_figures(fit.included(shifted, "aps", 0.9), shifted_labels)
    wide = set_figures(fit.included(shifted, "aps", 0.9, gamma=1.0), shifted_labels)
    assert wide["mean_size"] > plain["mean_size"] and wide["coverage"] >= plain["coverage"]
    choice = choose_gamma(fit, shifted, shifted_labels, "aps")
    assert choice["held_out_coverage"]["0"] == plain["coverage"]
    reached = [float(g) for g, c in choice["held_out_coverage"].items() if c >= GAMMA_COVERAGE]
    assert choice["gamma"] == (min(reached) if reached else choice["gamma"])


def test_selective_risk_is_bounded_and_the_curve_ends_at_the_error_rate() -> None:
    calibration, labels = simulated(3000, 4, seed=6, sharpness=6.0)  # confident enough to answer at 2%
    test, test_labels = simulated(3000, 4, seed=7, sharpness=6.0)
    fit = Calibrated(calibration, labels, RULES, delta=0.1)
    figures = selective_figures(fit, test, test_labels)
    assert list(figures) == [f"{r:g}" for r in RISKS]
    for risk, got in figures.items():
        assert got["threshold"] is not None and 0 < got["answered"] < 1
        assert got["risk"] <= float(risk) + 0.02  # finite-sample noise of the test split itself
    curve = risk_curve(test, test_labels)
    error_rate = float((test.probs.argmax(dim=1) != test_labels).double().mean())
    assert curve["answered"][-1] == 1.0 and abs(curve["risk"][-1] - error_rate) < 1e-12


def test_scored_sets_join_in_order() -> None:
    a, _ = simulated(5, 3, seed=8)
    b, _ = simulated(7, 3, seed=9)
    joined = Scored.joined([a, b])
    assert torch.equal(joined.probs, torch.cat([a.probs, b.probs])) and joined.ood.shape == (12,)


def test_no_threshold_means_every_input_abstains() -> None:
    calibration, labels = simulated(20, 4, seed=10)  # too few inputs for any max_risk in RISKS to be tested
    fit = Calibrated(calibration, labels, {"aps": ScoreRule("aps")}, delta=0.1)
    figures = selective_figures(fit, calibration, labels)
    assert all(f["threshold"] is None and f["answered"] == 0 and f["risk"] is None for f in figures.values())
