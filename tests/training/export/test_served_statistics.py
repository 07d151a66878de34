"""The sampling and temperature choices an export records, on a small artifact-contract model with known noise."""

from __future__ import annotations

import torch
from torch import nn

from training.data.images import Split
from training.export.served_statistics import (
    choose_default_samples,
    per_input_nll,
    served_temperature,
    temperature_on_shift,
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
