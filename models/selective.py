"""Selective prediction with a finite-sample guarantee: answer an input only when its confidence reaches a threshold
chosen on a calibration split by Learn then Test (Angelopoulos, Bates, Candes, Jordan and Lei, 2021), with
fixed-sequence testing (pure torch, shared by the export and the server; docs/method.md, "Acting on uncertainty:
prediction sets and abstentions").

The candidate thresholds are the calibration split's confidences, tested from the highest (fewest answers) down,
starting at the first that answers enough inputs to be rejected at all (``minimum_answered``: with no error among
``m`` answered inputs the p-value is ``(1 - max_risk)^m``; a test that cannot reject would stop the sequence at once,
and which tests those are depends on the confidences only, never on which predictions were right). At each, the null
hypothesis "the error rate among the inputs answered at this threshold exceeds ``max_risk``" is
rejected when the binomial p-value ``P(Binomial(answered, max_risk) <= errors)`` is at most ``delta``; testing stops at
the first threshold not rejected, and the lowest rejected one is served (testing in a fixed order spends the whole
``delta`` on each test and still controls the family-wise error). Then, with probability at least ``1 - delta`` over
the calibration split, the error rate among answered inputs is at most ``max_risk`` on inputs exchangeable with it.
When not even the highest threshold is rejected, no threshold meets the risk and every input abstains.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


def binomial_cdf(k: torch.Tensor, n: torch.Tensor, p: float) -> torch.Tensor:
    """``P(Binomial(n, p) <= k)`` elementwise (``k``, ``n`` int64 tensors of one shape), summed in log space."""
    k, n = k.long(), n.long()
    top = int(k.max()) if k.numel() else 0
    i = torch.arange(top + 1, dtype=torch.float64)  # [K]
    nf = n.double()[..., None]  # [..., 1]
    log_pmf = (torch.lgamma(nf + 1) - torch.lgamma(i + 1) - torch.lgamma((nf - i).clamp_min(0) + 1)
               + i * math.log(p) + (nf - i) * math.log1p(-p))  # [..., K]
    log_pmf = log_pmf.masked_fill((i > k.double()[..., None]) | (i > nf), -math.inf)
    return torch.logsumexp(log_pmf, dim=-1).exp().clamp(max=1.0)


def minimum_answered(max_risk: float, delta: float) -> int:
    """The fewest answered inputs whose binomial test can reject at ``delta``: ``(1 - max_risk)^m <= delta``."""
    return math.ceil(math.log(delta) / math.log1p(-max_risk) - 1e-9)


@dataclass(frozen=True)
class SelectiveThreshold:
    """The served confidence threshold for one ``max_risk`` (None: no threshold meets it, every input abstains), with
    what it rests on."""

    max_risk: float
    delta: float
    threshold: float | None
    answered: int  # calibration inputs answered at the threshold
    errors: int  # of those, wrong
    n: int  # calibration inputs


def learn_then_test(confidence: torch.Tensor, correct: torch.Tensor, max_risk: float, delta: float
                    ) -> SelectiveThreshold:
    """The lowest confidence threshold whose selective risk is at most ``max_risk`` with probability ``1 - delta``,
    from the calibration split's confidences ``[n]`` and whether each prediction was right ``[n]`` (bool)."""
    if not 0.0 < max_risk < 1.0 or not 0.0 < delta < 1.0:
        raise ValueError(f"max_risk and delta must be in (0, 1), got {max_risk} and {delta}")
    n = int(confidence.shape[0])
    order = confidence.double().argsort(descending=True, stable=True)  # [n] most confident first
    conf = confidence.double()[order]  # [n]
    errors = (~correct.bool()[order]).long().cumsum(0)  # [n] errors among the j + 1 most confident
    last = torch.ones(n, dtype=torch.bool)  # a threshold answers every input tied with it: test at the last of a tie
    last[:-1] = conf[1:] < conf[:-1]
    last[: minimum_answered(max_risk, delta) - 1] = False  # too few answered to reject: not tested
    candidates = torch.nonzero(last).squeeze(1)  # [m] indexes, highest threshold first
    answered = candidates + 1  # [m]
    p_values = binomial_cdf(errors[candidates], answered, max_risk)  # [m]
    failed = torch.nonzero(p_values > delta)
    stop = int(failed[0]) if failed.numel() else int(candidates.shape[0])  # tests rejected before the first failure
    if stop == 0:
        return SelectiveThreshold(max_risk, delta, None, 0, 0, n)
    index = int(candidates[stop - 1])
    return SelectiveThreshold(max_risk, delta, float(conf[index]), index + 1, int(errors[index]), n)


def answered_risk(threshold: float | None, confidence: torch.Tensor, wrong: torch.Tensor) -> dict[str, float | None]:
    """What a threshold does to some inputs' confidences ``[N]`` and mistakes ``[N]`` (bool): the threshold, the share
    answered and the error rate among the answered (None when none is; no threshold answers none)."""
    answered = confidence >= threshold if threshold is not None else torch.zeros_like(wrong)  # [N]
    count = int(answered.sum())
    return {"threshold": threshold, "answered": count / len(wrong),
            "risk": float(wrong[answered].double().mean()) if count else None}
