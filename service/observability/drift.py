"""Calibration drift of live confidences against the manifest's reference distribution.

KS: the largest gap between the live empirical CDF and the reference CDF (interpolated from the
manifest's evenly spaced quantiles). PSI: live vs reference shares of the bins cut at the reference
deciles (ties merged), ``sum (live - ref) * ln(live / ref)``. Neither is reported before the window holds
``min_window`` confidences."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

EPS = 1e-4


@dataclass(frozen=True)
class Drift:
    ks: float
    psi: float
    window: int


class DriftMonitor:
    def __init__(self, reference: dict[str, Any], window: int, min_window: int, owner: int = 0) -> None:
        self.owner = owner
        self.levels = np.asarray(reference["quantile_levels"], dtype=np.float64)
        self.quantiles = np.asarray(reference["confidence_quantiles"], dtype=np.float64)
        edges = np.unique(np.asarray(reference["confidence_deciles"], dtype=np.float64))
        self.edges = edges
        cdf_at_edges = self.reference_cdf(edges)
        self.ref_shares = np.clip(np.diff(np.concatenate([[0.0], cdf_at_edges, [1.0]])), EPS, None)
        self.values: deque[float] = deque(maxlen=window)
        self.min_window = min_window

    def reference_cdf(self, x: np.ndarray) -> np.ndarray:
        # quantiles may repeat (confidence saturates at 1): take the right-most level at ties
        return np.interp(x, self.quantiles, self.levels, left=0.0, right=1.0)

    def observe(self, confidences: list[float]) -> Drift | None:
        self.values.extend(confidences)
        if len(self.values) < self.min_window:
            return None
        live = np.sort(np.asarray(self.values, dtype=np.float64))
        n = live.size
        points = np.concatenate([live, self.quantiles])
        live_cdf = np.searchsorted(live, points, side="right") / n
        ks = float(np.max(np.abs(live_cdf - self.reference_cdf(points))))
        bins = np.searchsorted(self.edges, live, side="left")  # bin k holds (edge[k-1], edge[k]]
        live_shares = np.clip(np.bincount(bins, minlength=self.edges.size + 1) / n, EPS, None)
        psi = float(np.sum((live_shares - self.ref_shares) * np.log(live_shares / self.ref_shares)))
        return Drift(ks=ks, psi=psi, window=n)
