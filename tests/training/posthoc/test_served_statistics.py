"""The sampling and temperature choices an export records, on a small artifact-contract model with known noise."""

from __future__ import annotations

import torch
from torch import nn

from models.uncertainty import COMBINED, KERNEL_ERROR, ScoreTerm
from training.data.images import Split
from training.posthoc.ood_selection import Candidate, OodChoice
from training.posthoc.served_statistics import (
    choose_default_samples,
    fit_temperature_slope,
    per_input_nll,
    served_temperature,
    temperature_on_shift,
    temperature_terms,
)


class NoisyLinear(nn.Module):
    """Artifact contract ``forward(pixels, n_samples) -> [S, B, C]``: a fixed linear map plus Gaussian logit noise."""

    def __init__(self, noise: float) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(4, 3)
        self.noise = noise

    def forward(self, pixels: torch.Tensor, n_samples: int) -> torch.Tensor:
        logits = self.linear(pixels.flatten(1))  # [B, C]
        return logits + self.noise * torch.randn(n_samples, *logits.shape)  # [S, B, C]


def _split(n: int = 400) -> Split:
    gen = torch.Generator().manual_seed(1)
    images = torch.rand(n, 1, 2, 2, generator=gen)
    return Split(images, torch.randint(0, 3, (n,), generator=gen))


def test_noise_free_model_needs_one_sample() -> None:
    chosen, table, shifted = choose_default_samples(NoisyLinear(0.0), _split(), [1, 2, 4, 8], 8, seed=0)
    assert shifted == {}
    assert chosen == 1 and abs(table["1"]["minus_reference"]) < 1e-6


def test_noisy_model_needs_more_samples_and_the_table_says_why() -> None:
    chosen, table, _ = choose_default_samples(NoisyLinear(6.0), _split(), [1, 2, 4, 8, 16], 16, seed=0)
    assert chosen > 1
    assert table["1"]["minus_reference"] > 2 * table["1"]["stderr"]  # S = 1 is measurably worse than S = 16
    assert str(chosen) in table


def test_a_held_out_shift_can_ask_for_more_samples_than_validation() -> None:
    """Noise that barely matters on validation (confident inputs) but does on the shift (inputs near the boundary)."""
    model = NoisyLinear(1.5)
    with torch.no_grad():
        model.linear.weight.mul_(100.0)  # validation inputs far from the boundary: the noise moves nothing there
    images = _split().images
    with torch.no_grad():
        val = Split(images, model.linear(images.flatten(1)).argmax(1))  # the model's own answers, far from a tie
    shifted = Split(0.004 * val.images, val.labels)  # shrunk towards 0: logits small, every sample's noise counts
    alone, _, none = choose_default_samples(model, val, [1, 2, 4, 8, 16], 16, seed=0)
    both, table, shifted_table = choose_default_samples(model, val, [1, 2, 4, 8, 16], 16, seed=0, shifted=shifted)
    assert none == {} and alone == 1
    assert both > alone
    assert shifted_table["1"]["minus_reference"] > 2 * shifted_table["1"]["stderr"]  # the shift's reason, recorded
    assert set(table) == set(shifted_table) and str(both) in table


def test_temperature_served_only_when_it_wins_on_held_out_validation() -> None:
    gen = torch.Generator().manual_seed(2)
    true_logits = 2.0 * torch.randn(4000, 3, generator=gen)  # [N, C]
    labels = torch.multinomial(true_logits.softmax(-1), 1, generator=gen).squeeze(1)  # drawn from the model itself
    calibrated, _ = served_temperature(true_logits.unsqueeze(0), labels)
    overconfident, fit = served_temperature(3.0 * true_logits.unsqueeze(0), labels)
    assert abs(overconfident - 3.0) < 0.3 and fit["nll_fitted"] < fit["nll_t1"]
    assert abs(calibrated - 1.0) < 0.15
    nll = per_input_nll(3.0 * true_logits.unsqueeze(0), labels, overconfident)
    assert float(nll.mean()) < float(per_input_nll(3.0 * true_logits.unsqueeze(0), labels).mean())


def test_a_temperature_that_sharpens_the_shift_is_not_served_when_validation_cannot_tell() -> None:
    """Validation cannot tell T = 0.9 from 1 (confident inputs, labels drawn from the model's own probabilities),
    the shift (inputs near the boundary, labelled the same way) prefers 1: the shift decides. When validation clearly
    prefers the fitted temperature, it is kept whatever the shift says."""
    gen = torch.Generator().manual_seed(3)
    clean = 8.0 * torch.randn(1, 3000, 3, generator=gen)  # [S, N, C] confident
    clean_labels = torch.multinomial(clean[0].softmax(-1), 1, generator=gen).squeeze(1)
    shifted = 0.5 * torch.randn(1, 3000, 3, generator=gen)  # near ties
    shifted_labels = torch.multinomial(shifted[0].softmax(-1), 1, generator=gen).squeeze(1)
    kept, record = temperature_on_shift(0.9, clean, clean_labels, shifted, shifted_labels)
    assert kept == 1.0 and record["shift_nll_t1"] < record["shift_nll_fitted"]
    overconfident = 3.0 * clean  # validation now clearly wants the fitted temperature
    noisy_labels = torch.multinomial(clean[0].softmax(-1), 1, generator=gen).squeeze(1)
    kept, _ = temperature_on_shift(3.0, overconfident, noisy_labels, shifted, shifted_labels)
    assert kept == 3.0


def _confident(n: int, margin: float, wrong: float, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits [1, n, 2] with ``margin`` for class 0 and labels of which a share ``wrong`` is class 1."""
    logits = torch.tensor([margin, 0.0]).expand(1, n, 2).clone()
    return logits, (torch.rand(n, generator=gen) < wrong).long()


def test_the_temperature_slope_softens_high_scores_when_validation_cannot_tell() -> None:
    """Clean inputs all score below the center, so no slope changes their NLL; the shift's inputs score high and are
    overconfident (margin 4, 30% wrong): a positive slope is chosen, the one with the lowest NLL on the shift. When
    clean inputs above the center are confident and right, softening them is measurably worse on validation, and the
    slope stays 0."""
    gen = torch.Generator().manual_seed(4)
    term = ScoreTerm(KERNEL_ERROR, 1.0, 0.0, 1.0)
    clean, clean_labels = _confident(500, 4.0, 0.02, gen)
    shifted, shifted_labels = _confident(500, 4.0, 0.3, gen)
    low = {KERNEL_ERROR: -torch.rand(500, generator=gen)}  # z in (-1, 0]
    high = {KERNEL_ERROR: 2.0 + torch.rand(500, generator=gen)}  # z in [2, 3)
    grid = [0.0, 0.1, 0.3, 1.0]
    slope, table = fit_temperature_slope(1.0, (term,), grid, clean, clean_labels, low, shifted, shifted_labels, high)
    assert slope > 0 and all(table[f"{g:g}"]["eligible"] for g in grid)
    assert table[f"{slope:g}"]["shift_nll"] == min(row["shift_nll"] for row in table.values())
    sure, sure_labels = _confident(500, 6.0, 0.0, gen)
    slope, table = fit_temperature_slope(1.0, (term,), grid, sure, sure_labels, high, shifted, shifted_labels, high)
    assert slope == 0.0 and not table["1"]["eligible"]


def test_the_temperature_reads_the_served_score_only_when_it_reads_no_logits() -> None:
    val = {KERNEL_ERROR: torch.tensor([1e-3, 1e-2, 1e-1]), "mds": torch.tensor([1.0, 2.0, 3.0])}
    terms = (ScoreTerm(KERNEL_ERROR, 0.75, -4.0, 1.0, True), ScoreTerm("rmds", 0.25, 0.0, 2.0))
    combined = OodChoice("c", "c", {"c": Candidate(COMBINED, terms)}, {"c": 0.9})
    assert temperature_terms(combined, 1, val) == terms
    (mds,) = temperature_terms(OodChoice("mds", "mds", {"mds": Candidate("mds")}, {"mds": 0.9}), 1, val)
    assert mds.score == "mds" and mds.log and abs(mds.center - float(val["mds"].double().log().mean())) < 1e-9
    with_logits = (terms[0], ScoreTerm("energy", 0.25, 0.0, 1.0))
    choice = OodChoice("c", "c", {"c": Candidate(COMBINED, with_logits)}, {"c": 0.9})
    assert temperature_terms(choice, 1, val) == ()
    assert temperature_terms(OodChoice("e", "e", {"e": Candidate("energy")}, {"e": 0.9}), 1, val) == ()
