"""Everything the routes share, built once in the lifespan (``app.state.director``)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import NamedTuple

from service.config import Settings
from service.engine.decoding import DecodePool
from service.engine.device import Device
from service.engine.predictor import Predictor
from service.engine.repository import ModelRepository, VersionState
from service.feedback.calls import StoreCalls
from service.feedback.decisions import NO_LIVE_DECISIONS, LiveDecisions
from service.feedback.flusher import LogFlusher
from service.feedback.store import FeedbackStore, FeedbackUnavailable, LiveStats
from service.observability.exposition import Exposition
from service.observability.metrics import UNKNOWN, Metrics
from service.observability.statistics import Statistics

log = logging.getLogger("service.state")
LIVE_REFRESH_TIMEOUT_S = 60.0  # one refresh of the live gauges: a background read, so it may take long


class Readiness(NamedTuple):
    ready: bool
    models: dict[str, dict[str, str]]  # model -> version -> state
    missing: list[str]  # required models without a ready version
    saturated: list[str]  # the default or a required model whose queue is full


@dataclass
class Lifecycle:
    """``draining`` (set on SIGTERM) turns /health/ready to 503 and makes every response close its connection;
    predictions are still served until the lifespan closes the model versions, after the listener closed and the
    requests in progress were answered."""

    draining: bool = False


@dataclass
class AppState:
    settings: Settings
    device: Device
    metrics: Metrics
    repository: ModelRepository
    feedback: FeedbackStore
    lifecycle: Lifecycle
    decoder: DecodePool
    store_calls: StoreCalls
    statistics: Statistics  # Triton's statistics extension
    predictor: Predictor  # the prediction use-case the protocols share
    flusher: LogFlusher  # writes the prediction log; closes the store
    exposition: Exposition  # the /metrics body, made at most once per metrics_max_age_s
    # per version, the live levels exported last: the next refresh keeps those still short of their promise
    exported_levels: dict[tuple[str, str], LiveDecisions] = field(default_factory=dict)

    def metrics_body(self) -> bytes:
        """The values read at scrape time (device memory, the log's backlog, the store's health), then the body."""
        self.metrics.observe_device_memory(self.device.memory_stats())
        self.metrics.prediction_log_pending.set(self.feedback.pending)
        self.metrics.feedback_store_up.set(0 if self.store_calls.failing else 1)
        return self.metrics.expose()

    def metric_labels(self, model: str | None, version: str | None) -> tuple[str, str]:
        """Bounded label values: names the repository does not know become ``unknown``."""
        if model is None or not self.repository.is_known(model):
            return UNKNOWN, UNKNOWN
        if version is None or not self.repository.is_known(model, version):
            return model, UNKNOWN
        return model, version

    def sync_version_metrics(self) -> None:
        """Run on every repository change: ``director_model_info`` for every version; reference values, queue
        capacity and zeroed counters for every ready one (``Metrics.publish_version``); those series removed for
        a version that is no longer ready (unloaded, or replaced by a reload that failed)."""
        metrics = self.metrics
        versions = self.repository.all_versions()
        metrics.set_model_info({(v.name, v.version, v.method, v.state.value) for v in versions})
        ready = {(r.name, r.version): r for r in (v.ready() for v in versions) if r is not None}
        for name, version in metrics.published_versions() - set(ready):
            metrics.unpublish_version(name, version)
        for (name, version), entry in ready.items():
            metrics.publish_version(name, version, entry.artifact.manifest, entry.worker.max_queue)

    async def refresh_live_gauges(self) -> None:
        """Live accuracy and ECE of every known version, and its live coverage and selective risk per exported level,
        read from the feedback store on its own threads (``LiveRefresher`` calls this on a schedule, never a scrape):
        labels that reached another replica sharing the store (or an earlier process) count too. The gauges follow
        the store: a version with no labelled row left loses its live series. While the store is slow or away they
        keep their last values."""
        live = self.metrics.live
        try:
            stats = await self.store_calls.run(self._live_stats, dict(self.exported_levels),
                                               timeout_s=LIVE_REFRESH_TIMEOUT_S)
        except FeedbackUnavailable as exc:
            log.warning("live gauges not refreshed: %s", exc)
            return
        for model, version in live.versions() - set(stats):
            live.forget(model, version)
            self.exported_levels.pop((model, version), None)
        for (model, version), (stats_of, decided) in stats.items():
            if not self.repository.is_known(model, version):
                continue
            if stats_of is not None:
                live.set_stats(model, version, stats_of.accuracy, stats_of.ece, stats_of.clients)
            live.set_decisions(model, version, decided.by_kind())
            self.exported_levels[(model, version)] = decided

    def _live_stats(self, exported: dict[tuple[str, str], LiveDecisions]
                    ) -> dict[tuple[str, str], tuple[LiveStats | None, LiveDecisions]]:
        """Prunes first, so rows past their age leave the gauges even while no prediction is logged."""
        self.feedback.prune()
        return {(model, version): (self.feedback.live_stats(model, version),
                                   self.feedback.live_decisions(model, version,
                                                                exported.get((model, version), NO_LIVE_DECISIONS)))
                for model, version in self.feedback.labelled_versions()}

    def readiness(self) -> Readiness:
        """Ready: the first scan is done, nothing is loading, at least one version is ready, every required
        model has a ready version, the server is not draining, and neither the default model nor a required one
        has a full queue (its predictions would be refused: a load balancer should send them elsewhere)."""
        repo = self.repository
        states = {v.name: {} for v in repo.all_versions()}
        for v in repo.all_versions():
            states[v.name][v.version] = v.state.value
        missing = [name for name in self.settings.required_models if repo.default_version(name) is None]
        saturated = []
        for name in dict.fromkeys([self.settings.default_model, *self.settings.required_models]):
            entry = repo.default_version(name) if repo.is_known(name) else None
            worker = entry.worker if entry is not None else None
            if worker is not None and worker.pending >= worker.max_queue:
                saturated.append(name)
        loading = any(v.state is VersionState.LOADING for v in repo.all_versions())
        any_ready = any(v.state is VersionState.READY for v in repo.all_versions())
        ready = (repo.scanned_once and not loading and any_ready and not missing and not saturated
                 and not self.lifecycle.draining)
        return Readiness(ready, states, missing, saturated)
