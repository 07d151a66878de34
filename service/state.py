"""Everything the routes share, built once in the lifespan (``app.state.director``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from service.config import Settings
from service.decoding import DecodePool
from service.device import Device
from service.drift import DriftMonitor
from service.feedback import FeedbackStore
from service.metrics import UNKNOWN, Metrics
from service.repository import ModelRepository, VersionState


@dataclass
class Lifecycle:
    """``draining`` turns /health/ready to 503 and refuses new predictions while queued work finishes."""

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
    drift: dict[tuple[str, str], DriftMonitor] = field(default_factory=dict)

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
            metrics.publish_version(name, version, entry.artifact.manifest.document(), entry.worker.max_queue)

    def readiness(self) -> tuple[bool, dict[str, dict[str, str]], list[str]]:
        """Ready: the first scan is done, nothing is loading, at least one version is ready, every required
        model has a ready version, and the server is not draining."""
        repo = self.repository
        states = {v.name: {} for v in repo.all_versions()}
        for v in repo.all_versions():
            states[v.name][v.version] = v.state.value
        missing = [name for name in self.settings.required_models if repo.default_version(name) is None]
        loading = any(v.state is VersionState.LOADING for v in repo.all_versions())
        any_ready = any(v.state is VersionState.READY for v in repo.all_versions())
        ready = repo.scanned_once and not loading and any_ready and not missing and not self.lifecycle.draining
        return ready, states, missing
