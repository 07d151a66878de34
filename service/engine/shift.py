"""Whether a request's inputs look exchangeable with the version's calibration data, the assumption every prediction
set and abstention rests on (docs/method.md, "When the guarantees hold"; docs/api.md, "Prediction sets and
abstentions").

Three signals, each already served, read together:

- **the input**: its OOD flag (its score over the threshold that passes 95% of in-distribution validation inputs);
- **the request's own inputs**: ``k`` of its ``n`` inputs flagged where a share ``1 - tpr`` of in-distribution inputs
  are: a one-sided binomial test at ``BATCH_ALPHA`` says the batch as a whole has shifted, its unflagged inputs
  included (on rotated images half of them pass the flag, and their sets hold the true label a tenth of the time);
- **the live traffic**: the version's drift monitor, the KS distance of its latest window of confidences (at the
  default sample count) to the validation reference, past ``LIVE_KS`` (the drift alert's threshold).

An input is *exchangeable* when none of the three speaks against it. The request-level reasons (batch or live) are
population-level: they say the guarantee is gone for every input of the request, which ``widen_if_shifted`` and
``abstain_if_ood`` act on."""

from __future__ import annotations

import math
from dataclasses import dataclass

from service.observability.drift import Drift

BATCH_ALPHA = 0.01  # a request of in-distribution inputs is called shifted once in a hundred at most
LIVE_KS = 0.1  # as director:threshold:drift_ks


@dataclass(frozen=True)
class Shift:
    flagged: list[bool]  # per input: its OOD flag
    population: str | None  # why the request's inputs as a whole look shifted (their batch, or the live window)

    @property
    def exchangeable(self) -> list[bool]:
        return [not flag and self.population is None for flag in self.flagged]


def binomial_tail(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p), summed in log space (n may be thousands)."""
    if k <= 0:
        return 1.0
    logs = [math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * math.log(p)
            + (n - i) * math.log1p(-p) for i in range(k, n + 1)]
    top = max(logs)
    return min(1.0, math.exp(top) * sum(math.exp(value - top) for value in logs))


def expected_flag_rate(tpr: float | None) -> float:
    """The share of in-distribution inputs the OOD flag takes: ``1 - ood.tpr`` (manifests written before ``tpr`` was
    chose their thresholds at 95%), kept inside (0, 1) for the binomial test."""
    return min(max(1.0 - (tpr if tpr is not None else 0.95), 1e-6), 1 - 1e-6)


def check_shift(flagged: list[bool], expected_rate: float, drift: Drift | None) -> Shift:
    """The request's shift signals: ``flagged`` its inputs' OOD flags, ``expected_rate`` the share of in-distribution
    inputs the flag takes (``1 - ood.tpr``), ``drift`` the version's latest live drift (None before its window
    fills)."""
    n, k = len(flagged), sum(flagged)
    p_value = binomial_tail(k, n, expected_rate) if k else 1.0
    if p_value < BATCH_ALPHA:
        return Shift(flagged, f"{k} of the request's {n} inputs are flagged OOD where {expected_rate:.0%} of "
                              f"in-distribution inputs are (binomial p = {p_value:.2g} < {BATCH_ALPHA})")
    if drift is not None and drift.ks > LIVE_KS:
        return Shift(flagged, f"the version's live confidences have drifted from its validation reference (KS "
                              f"{drift.ks:.2f} over the latest {drift.window} > {LIVE_KS})")
    return Shift(flagged, None)
