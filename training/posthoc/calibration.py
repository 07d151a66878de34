"""Post-hoc calibration fitted on validation: temperature scaling of logits and, for sampled methods,
the DIRECTOR noise temperature (a scale on every step's std)."""

from __future__ import annotations

import torch

from models.uncertainty import summarize
from training.metrics import nll


def fit_temperature(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """Temperature minimising validation NLL of ``mean_s softmax(z_s / T)``; logits [S, N, C] or [N, C].

    A 1-D search on log T (coarse grid, then a finer one around the best) is robust and cheap here.
    """
    z = logits if logits.dim() == 3 else logits.unsqueeze(0)  # [S, N, C]

    def loss(log_t: float) -> float:
        return nll(summarize(z, temperature=float(torch.tensor(log_t).exp())).probabilities, labels)

    grid = torch.linspace(-1.5, 1.5, 31)
    best = min(grid.tolist(), key=loss)
    fine = torch.linspace(best - 0.1, best + 0.1, 21)
    best = min(fine.tolist(), key=loss)
    return float(torch.tensor(best).exp())
