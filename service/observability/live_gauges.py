"""The live gauges: accuracy, ECE, coverage and selective risk over the latest labelled rows of each model version
(``service.feedback``), with how many feedback clients fed each window and, per coverage or risk level, a robust
reading that no single client's labels can make look bad (``_robust_ratio``, ``_robust_count``,
``decisions.live_rate``): the figure the alerts read, with the clients they need (``director_feedback_min_clients``;
docs/operations.md, "Who can move the live gauges").

The gauges follow the store: a version's series are set from what the store holds on every refresh, and removed
when the store holds no labelled row of it any more (pruned by age, or never labelled since a restart). A level
exported while short of its promise stays exported while it is (``decisions.exported_levels``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

from prometheus_client import CollectorRegistry, Gauge

MV = ("model", "version")
SeriesKey = tuple[Gauge, tuple[str, ...]]
KIND_LABELS = {"coverage": "coverage", "selective_risk": "max_risk"}


class LevelRate(Protocol):
    """A level's live reading (``service.feedback.decisions.LiveRate``)."""

    value: float
    n: int
    clients: int
    robust_value: float
    robust_n: int


Levels = Mapping[str, Mapping[float, LevelRate]]  # kind (coverage, selective_risk) -> level -> its reading


class LiveGauges:
    def __init__(self, r: CollectorRegistry, remove: Callable[[Gauge, tuple[str, ...]], None]) -> None:
        self._remove = remove
        self.accuracy = Gauge("director_live_accuracy_ratio", "accuracy over the latest labelled predictions", MV,
                              registry=r, multiprocess_mode="mostrecent")
        self.ece = Gauge("director_live_ece_ratio", "ECE over the latest labelled predictions", MV, registry=r,
                         multiprocess_mode="mostrecent")
        self.clients = Gauge("director_live_feedback_clients", "distinct feedback clients (feedback key names, else "
                             "peer addresses) behind director_live_accuracy_ratio", MV, registry=r,
                             multiprocess_mode="mostrecent")
        self.min_clients = Gauge("director_feedback_min_clients", "feedback clients a live window needs before the "
                                 "coverage and selective risk alerts read it (DIRECTOR_FEEDBACK_MIN_CLIENTS)",
                                 registry=r, multiprocess_mode="livemax")
        self.decisions = {kind: self._level_gauges(r, kind) for kind in KIND_LABELS}
        self._series: dict[tuple[str, str], set[SeriesKey]] = {}  # per version, to remove what it no longer reports

    def _level_gauges(self, r: CollectorRegistry, kind: str) -> dict[str, Gauge]:
        label = KIND_LABELS[kind]
        name, what = (("director_live_coverage", "share of the latest labelled inputs asked for this coverage whose "
                       "prediction set held the true label (multi-label: their sets' mean recall of the true labels)")
                      if kind == "coverage" else
                      ("director_live_selective_risk", "error rate of the latest answered (not abstained), labelled "
                       "inputs asked for this max_risk"))
        level = ("director_live_coverage_target_ratio", "the coverage asked for (the label, as a value)") \
            if kind == "coverage" else ("director_live_selective_risk_bound_ratio", "the max_risk asked for (the "
                                        "label, as a value)")

        def gauge(metric: str, documentation: str) -> Gauge:
            return Gauge(metric, documentation, [*MV, label], registry=r, multiprocess_mode="mostrecent")

        return {"ratio": gauge(f"{name}_ratio", what),
                "count": gauge(f"{name}_count", f"labelled inputs behind {name}_ratio"),
                "level": gauge(*level),
                "clients": gauge(f"{name}_clients", f"distinct feedback clients behind {name}_ratio"),
                "robust_ratio": gauge(f"{name}_robust_ratio", f"the most favourable of {name}_ratio and its value "
                                      "without any one feedback client that sent at most half the window (what the "
                                      "alert reads)"),
                "robust_count": gauge(f"{name}_robust_count", f"labelled inputs behind {name}_robust_ratio")}

    def set_stats(self, model: str, version: str, accuracy: float, ece: float | None, clients: int) -> None:
        """Live accuracy, ECE (None: the version's accuracy is an exact-match rate, which has none) and clients."""
        labels = (model, version)
        values: dict[SeriesKey, float] = {(self.accuracy, labels): accuracy, (self.clients, labels): float(clients)}
        if ece is not None:
            values[(self.ece, labels)] = ece
        self._set(labels, values)

    def set_decisions(self, model: str, version: str, decided: Levels) -> None:
        """A version's exported levels; series of levels it no longer exports are removed."""
        labels = (model, version)
        values: dict[SeriesKey, float] = {}
        for kind, gauges in self.decisions.items():
            for level, rate in decided.get(kind, {}).items():
                values.update(level_values(gauges, (*labels, repr(float(level))), level, rate))
        levels = {key for key in self._series.get(labels, set()) if len(key[1]) == 3}
        for key in levels - set(values):
            self._remove(*key)
        self._set(labels, values)
        self._series[labels] = {key for key in self._series[labels] if len(key[1]) == 2 or key in values}

    def versions(self) -> set[tuple[str, str]]:
        return set(self._series)

    def forget(self, model: str, version: str) -> None:
        """The store holds no labelled row of the version any more: its live series go."""
        for key in self._series.pop((model, version), set()):
            self._remove(*key)

    def _set(self, labels: tuple[str, str], values: dict[SeriesKey, float]) -> None:
        for (gauge, series), value in values.items():
            gauge.labels(*series).set(value)
        self._series.setdefault(labels, set()).update(values)


def level_values(gauges: dict[str, Gauge], series: tuple[str, ...], level: float,
                 rate: LevelRate) -> dict[SeriesKey, float]:
    return {(gauges["ratio"], series): rate.value, (gauges["count"], series): float(rate.n),
            (gauges["level"], series): float(level), (gauges["clients"], series): float(rate.clients),
            (gauges["robust_ratio"], series): rate.robust_value,
            (gauges["robust_count"], series): float(rate.robust_n)}
