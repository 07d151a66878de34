"""A manifest's validation reference as gauge values (``director_reference_*`` and ``director_ood_threshold``),
read through the typed manifest: what the alerts and the dashboard compare the live series with."""

from __future__ import annotations

import math

import numpy as np

from artifact.contract import Manifest

REFERENCE_QUANTILES = (0.1, 0.5, 0.9)  # levels of the director_reference_<distribution>{quantile} gauges
REFERENCE_DISTRIBUTIONS = ("confidence", "predictive_entropy", "mutual_information")  # manifest <name>_quantiles


def reference_values(manifest: Manifest) -> dict[str, float]:
    """The manifest's reference statistics as gauge values: ``accuracy``, ``ece``, ``ood_rate`` (the measured
    in-distribution rate, else ``1 - ood.tpr``) and ``<distribution>@<level>`` for the ``REFERENCE_QUANTILES``
    (linear interpolation of its evenly spaced quantiles). Missing or non-finite entries are left out."""
    reference = manifest.reference
    tpr = manifest.ood.tpr
    candidates: list[tuple[str, float | None]] = [("ood_rate", None if tpr is None else 1.0 - tpr)]
    if reference is not None:
        candidates = [("accuracy", reference.accuracy), ("ece", reference.ece),
                      ("ood_rate", reference.ood_rate if reference.ood_rate is not None else candidates[0][1])]
        for distribution in REFERENCE_DISTRIBUTIONS:
            quantiles = getattr(reference, f"{distribution}_quantiles")
            for q in REFERENCE_QUANTILES:
                candidates.append((f"{distribution}@{q}", interpolate(reference.quantile_levels, quantiles, q)))
    return {name: value for name, value in candidates if value is not None and math.isfinite(value)}


def ood_thresholds(manifest: Manifest) -> dict[tuple[str, str], float]:
    """The manifest's ``ood.thresholds`` as {(sample count, score): threshold}, finite ones only."""
    return {(str(count), rule.score): rule.threshold for count, rule in manifest.ood.thresholds.items()
            if math.isfinite(rule.threshold)}


def interpolate(levels: list[float] | None, quantiles: list[float] | None, q: float) -> float | None:
    """The value at level ``q`` of a distribution given at ``levels``; None when the two do not describe one."""
    if levels is None or quantiles is None:
        return None
    x = np.asarray(levels, dtype=np.float64)
    y = np.asarray(quantiles, dtype=np.float64)
    if x.ndim != 1 or x.shape != y.shape or x.size < 2 or not (x[0] <= q <= x[-1]) or np.any(np.diff(x) <= 0):
        return None
    return float(np.interp(q, x, y))
