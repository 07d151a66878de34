"""Prometheus metrics (prefix ``director_``, base units). Labels ``model`` and ``version`` are bounded:
names the repository does not know are counted as ``unknown``. When ``PROMETHEUS_MULTIPROC_DIR`` is set
(several uvicorn workers) values live in the shared directory and ``/metrics`` aggregates them.

The registry carries the standard ``process_*``, ``python_gc_*`` and ``python_info`` collectors; no counter or
histogram exports a ``_created`` series (``disable_created_metrics``: Prometheus does not read them, and they
doubled every counter's series). Gauges of a value between 0 and 1 end in ``_ratio`` (live accuracy, ECE, coverage
and selective risk, the reference accuracy, ECE, OOD share and confidence quantiles); ``director_confidence_drift_ks``
is a distance between distributions and keeps its name. Live coverage and selective risk carry the level a request
asked for as a label (``coverage``, ``max_risk``), at most 16 per version (``service.feedback.decisions``), with the
level as a value beside them (``_target_ratio``, ``_bound_ratio``) for alerts to compare with
(``service.observability.live_gauges``).
``director_class_predictions_total{label}`` counts predictions per class, its ``label`` values bounded by the
version's manifest.

Per-version series follow the repository (``publish_version`` / ``unpublish_version``, called by
``AppState.sync_version_metrics`` on every change): while a version is ready, its manifest's reference values
(``director_reference_*``) and its queue capacity are exported, and its labelled counters (one per class of its
manifest for the per-class counter) exist at 0 so that
``rate()`` sees their first increment; once it is unloaded (removed, or replaced by a version that failed to
load) its reference and capacity series disappear. Counters and histograms of an unloaded version stay (their
totals are history).

Multiprocess mode: every worker loads every model, so every worker sets the same reference values. Those
gauges use ``livemostrecent``: one series per version (no ``pid`` label, unlike ``all``/``liveall``), the
latest value any live worker wrote, and a worker's values go with it when it exits (``mark_process_dead``);
``mostrecent`` would keep a dead worker's values for ever. Queue capacity is ``livesum`` like queue depth (each
worker has its own queue), so depth / capacity is the replica's fill ratio. prometheus-client cannot delete a
series from the shared files (``remove`` only forgets it in the calling process), so in that mode a removed
series is overwritten with NaN and ``expose`` leaves NaN gauge samples out. The process collector then reports
every live worker (``process_*{pid}``, read from ``/proc``, whichever worker answers the scrape); garbage
collection statistics exist only inside each process, so ``python_gc_*`` is left out in that mode rather than
report whichever worker answered."""

from __future__ import annotations

import collections
import logging
import math
from collections.abc import Iterable, Mapping

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)

from artifact.contract import Manifest
from models.tasks import MultiLabelSummary
from models.uncertainty import UncertaintySummary
from service.observability.gpu_metrics import GpuMemoryCollector, GpuUtilisationCollector
from service.observability.live_gauges import LiveGauges
from service.observability.multiprocess import expose_workers, multiprocess_dir
from service.observability.reference import REFERENCE_QUANTILES, ood_thresholds, reference_values

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
TOKEN_BUCKETS = (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
CONFIDENCE_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0)
ENTROPY_BUCKETS = (0.01, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0)
MI_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0)
OOD_BUCKETS = (-20.0, -15.0, -10.0, -7.5, -5.0, -2.5, -1.0, 0.0, 0.01, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5,
               2.0, 3.0, 5.0)
# the OOD score relative to its threshold (``OodRule.relative``): 1 is the threshold, whatever the model
RELATIVE_OOD_BUCKETS = (-2.0, -1.0, -0.5, 0.0, 0.25, 0.5, 0.75, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 3.0, 5.0, 10.0, 20.0,
                        50.0)
MV = ("model", "version")
UNKNOWN = "unknown"
# a multi-label model's per-label series: its first MAX_LABEL_SERIES labels by name, the rest as OTHER_LABELS
MAX_LABEL_SERIES = 64
OTHER_LABELS = "other"
LABEL_COUNT_BUCKETS = (0, 1, 2, 3, 4, 5, 8, 16, 32, 64)
# every reason the server refuses a request for (director_rejected_requests_total{reason})
QUEUE_FULL, TIMEOUT, DRAINING = "queue_full", "timeout", "draining"
REJECT_REASONS = (QUEUE_FULL, TIMEOUT, DRAINING)

log = logging.getLogger("service.observability.metrics")

# process-wide by prometheus-client's design; this module's counters and histograms are created after it
disable_created_metrics()

SeriesKey = tuple[Gauge, tuple[str, ...]]


def label_series(names: list[str], index: int) -> str:
    """The series name of a label: its own among the first ``MAX_LABEL_SERIES``, else ``OTHER_LABELS`` (a tagger
    with thousands of labels keeps a bounded number of series)."""
    return names[index] if 0 <= index < min(len(names), MAX_LABEL_SERIES) else OTHER_LABELS


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        ProcessCollector(registry=r)
        GCCollector(registry=r)
        PlatformCollector(registry=r)
        self._requests_and_batches(r)
        self._predictions(r)
        self._feedback_and_device(r)
        self.live = LiveGauges(r, self._remove)  # accuracy, ECE, coverage, selective risk from feedback
        self._references(r)
        self._published: dict[tuple[str, str], set[SeriesKey]] = {}  # per-version gauges, to remove on unload
        self._info: set[tuple[str, str, str, str]] = set()
        self._class_labels: dict[tuple[str, str], list[str]] = {}  # the manifest's labels of each ready version

    def _requests_and_batches(self, r: CollectorRegistry) -> None:
        self.requests = Counter("director_requests_total", "HTTP requests by route template and status",
                                ["endpoint", "code"], registry=r)
        self.request_duration = Histogram("director_request_duration_seconds", "HTTP request latency",
                                          ["endpoint"], buckets=LATENCY_BUCKETS, registry=r)
        self.model_requests = Histogram("director_model_request_duration_seconds", "a model version's requests from "
                                        "queueing to result, by outcome (success, fail)", [*MV, "outcome"],
                                        buckets=LATENCY_BUCKETS, registry=r)
        self.queue_wait = Histogram("director_queue_wait_seconds", "time a request waited for its batch", MV,
                                    buckets=LATENCY_BUCKETS, registry=r)
        self.inference = Histogram("director_inference_duration_seconds", "forward + summary time of one batch",
                                   MV, buckets=LATENCY_BUCKETS, registry=r)
        self.batch_size = Histogram("director_batch_size", "inputs per forward batch", MV, buckets=BATCH_BUCKETS,
                                    registry=r)
        self.batch_requests = Histogram("director_batch_requests", "requests packed into one batch", MV,
                                        buckets=BATCH_BUCKETS, registry=r)
        self.batch_samples = Histogram("director_batch_samples", "sampled rows (inputs x n_samples) per batch",
                                       MV, buckets=BATCH_BUCKETS, registry=r)
        self.batch_tokens = Histogram("director_batch_tokens", "text models: padded tokens x samples per batch", MV,
                                      buckets=TOKEN_BUCKETS, registry=r)
        self.queue_depth = Gauge("director_queue_depth", "requests waiting for a batch", MV, registry=r,
                                 multiprocess_mode="livesum")
        self.queue_capacity = Gauge("director_queue_capacity", "queue slots of a ready version (DIRECTOR_MAX_QUEUE; "
                                    "summed over worker processes like queue_depth)", MV, registry=r,
                                    multiprocess_mode="livesum")
        self.rejected = Counter("director_rejected_requests_total", "requests refused (queue_full, timeout, "
                                "draining)", [*MV, "reason"], registry=r)

    def _predictions(self, r: CollectorRegistry) -> None:
        self.predictions = Counter("director_predictions_total", "inputs predicted", MV, registry=r)
        self.class_predictions = Counter("director_class_predictions_total", "inputs predicted per class (label: "
                                         "the manifest's label, else unknown)", [*MV, "label"], registry=r)
        self.ood_predictions = Counter("director_ood_predictions_total", "inputs flagged out-of-distribution",
                                       MV, registry=r)
        self.confidence = Histogram("director_prediction_confidence", "max of the mean probability", MV,
                                    buckets=CONFIDENCE_BUCKETS, registry=r)
        self.entropy = Histogram("director_predictive_entropy_nats", "entropy of the mean probability", MV,
                                 buckets=ENTROPY_BUCKETS, registry=r)
        self.mutual_information = Histogram("director_mutual_information_nats", "predictive minus expected "
                                            "entropy", MV, buckets=MI_BUCKETS, registry=r)
        self.ood_score = Histogram("director_ood_score", "the manifest's OOD score (higher = more OOD), raw: its scale "
                                   "is the model's", MV, buckets=OOD_BUCKETS, registry=r)
        self.ood_score_relative = Histogram("director_ood_score_relative", "the OOD score relative to its threshold, "
                                            "1 + (score - threshold) / |threshold|: 1 at the threshold, flagged above "
                                            "it, one scale for every model", MV, buckets=RELATIVE_OOD_BUCKETS,
                                            registry=r)
        self.predicted_labels = Histogram("director_predicted_labels", "labels predicted per input (multi-label "
                                          "models)", MV, buckets=LABEL_COUNT_BUCKETS, registry=r)
        self.drift_ks = Gauge("director_confidence_drift_ks", "KS distance of live confidences (default sample "
                              "count) to the reference", MV, registry=r, multiprocess_mode="livemostrecent")
        self.drift_psi = Gauge("director_confidence_drift_psi", "PSI of live confidences over the reference "
                               "deciles", MV, registry=r, multiprocess_mode="livemostrecent")

    def _feedback_and_device(self, r: CollectorRegistry) -> None:
        self.feedback = Counter("director_feedback_total", "ground-truth labels received", MV, registry=r)
        self.label_feedback = Counter("director_feedback_label_decisions_total", "multi-label feedback per label: "
                                      "whether the logged prediction decided the label right (live accuracy per "
                                      "label: correct over all)", [*MV, "label", "outcome"], registry=r)
        self.prediction_log_dropped = Counter("director_prediction_log_dropped_total", "logged predictions dropped "
                                              "unwritten: the store was away while more than feedback_max_rows "
                                              "gathered, or at shutdown", registry=r)
        self.feedback_store_up = Gauge("director_feedback_store_up", "1 while the feedback store answers, 0 while its "
                                       "calls fail and are refused at once (tried again every feedback_retry_s)",
                                       registry=r, multiprocess_mode="livemin")
        self.prediction_log_pending = Gauge("director_prediction_log_pending", "logged predictions waiting to be "
                                            "written to the feedback store", registry=r, multiprocess_mode="livesum")
        self.gpu_memory = Gauge("director_gpu_memory_allocated_bytes", "torch CUDA memory allocated", registry=r,
                                multiprocess_mode="livesum")
        self.gpu_memory_reserved = Gauge("director_gpu_memory_reserved_bytes", "torch CUDA memory held by the "
                                         "caching allocator (allocated plus cached for reuse)", registry=r,
                                         multiprocess_mode="livesum")
        self.gpu_memory_peak = Gauge("director_gpu_memory_peak_bytes", "highest torch CUDA memory allocated since the "
                                     "process started", registry=r, multiprocess_mode="livemax")
        self.gpu_out_of_memory = Counter("director_gpu_out_of_memory_total", "forwards that ran out of device memory "
                                         "(each failed its batch with 503; the server goes on)", registry=r)
        r.register(GpuMemoryCollector())  # director_gpu_memory_{used,total}_bytes, read at each scrape
        r.register(GpuUtilisationCollector())  # director_gpu_utilization_ratio, through NVML when installed
        self.model_info = Gauge("director_model_info", "1 per served model version, with its state", [
            *MV, "method", "state"], registry=r, multiprocess_mode="livemostrecent")

    def _references(self, r: CollectorRegistry) -> None:
        """The manifest's validation reference of each ready version (what the alerts and dashboard compare with)."""
        def reference(name: str, documentation: str, labels: tuple[str, ...] = MV) -> Gauge:
            return Gauge(name, documentation, labels, registry=r, multiprocess_mode="livemostrecent")

        quantile = (*MV, "quantile")
        self.reference_accuracy = reference("director_reference_accuracy_ratio", "validation accuracy in the "
                                            "manifest (default sample count)")
        self.reference_ece = reference("director_reference_ece_ratio", "validation ECE in the manifest (default "
                                       "sample count)")
        self.reference_ood_rate = reference("director_reference_ood_ratio", "share of in-distribution validation "
                                            "inputs the manifest's OOD rule flags (else 1 - ood.tpr)")
        self.calibration_inputs = reference("director_reference_calibration_inputs", "inputs of the calibration split "
                                            "behind the version's prediction sets and abstentions (manifest "
                                            "conformal.n, or multi_label.recall.n for a multi-label version's "
                                            "label sets)")
        self.ood_threshold = reference("director_ood_threshold", "the manifest's OOD flag threshold (is_ood = "
                                       "ood_score > threshold) per calibrated sample count, and the score it applies "
                                       "to", (*MV, "n_samples", "score"))
        self.reference_distributions = {
            "confidence": reference("director_reference_confidence_ratio", "validation confidence at a quantile "
                                    "level", quantile),
            "predictive_entropy": reference("director_reference_predictive_entropy_nats", "validation predictive "
                                            "entropy at a quantile level", quantile),
            "mutual_information": reference("director_reference_mutual_information_nats", "validation mutual "
                                            "information at a quantile level", quantile),
        }

    def observe_summary(self, model: str, version: str, summary: UncertaintySummary, ood: list[float],
                        flags: list[bool], relative_ood: list[float]) -> None:
        labels = (model, version)
        self.predictions.labels(*labels).inc(len(flags))
        flagged = sum(flags)
        self.ood_predictions.labels(*labels).inc(flagged)  # inc(0) still creates the series
        names = self._class_labels.get(labels, [])
        if isinstance(summary, MultiLabelSummary):  # each predicted label counts, an input under several or none
            self._observe_label_sets(labels, summary, names)
        else:
            for index, count in collections.Counter(summary.prediction.tolist()).items():
                name = names[index] if 0 <= index < len(names) else UNKNOWN
                self.class_predictions.labels(*labels, name).inc(count)
        for values, hist in ((summary.confidence.tolist(), self.confidence),
                             (summary.predictive_entropy.tolist(), self.entropy),
                             (summary.mutual_information.tolist(), self.mutual_information),
                             (ood, self.ood_score), (relative_ood, self.ood_score_relative)):
            child = hist.labels(*labels)
            for value in values:
                child.observe(value)

    def _observe_label_sets(self, labels: tuple[str, str], summary: MultiLabelSummary, names: list[str]) -> None:
        for count in summary.predicted.sum(-1).tolist():
            self.predicted_labels.labels(*labels).observe(count)
        for index, count in enumerate(summary.predicted.sum(0).tolist()):
            if count:
                self.class_predictions.labels(*labels, label_series(names, index)).inc(count)

    def observe_label_feedback(self, model: str, version: str, outcomes: Mapping[str, bool]) -> None:
        """One multi-label feedback's per-label outcomes (label name -> decided right), bounded series."""
        names = self._class_labels.get((model, version), [])
        for name, right in outcomes.items():
            series = label_series(names, names.index(name)) if name in names else OTHER_LABELS
            self.label_feedback.labels(model, version, series, "correct" if right else "wrong").inc()

    def observe_device_memory(self, stats: tuple[int, int, int] | None) -> None:
        """(allocated, reserved, peak) bytes of the CUDA device (``Device.memory_stats``); nothing off CUDA."""
        if stats is not None:
            allocated, reserved, peak = stats
            self.gpu_memory.set(allocated)
            self.gpu_memory_reserved.set(reserved)
            self.gpu_memory_peak.set(peak)

    # per-version series -------------------------------------------------------------------------------
    def publish_version(self, model: str, version: str, manifest: Manifest, max_queue: int) -> None:
        """A ready version: its reference values and queue capacity, and its labelled counters at 0. Idempotent
        (called on every repository change); series of an earlier manifest of the version that this one lacks
        are removed."""
        labels = (model, version)
        values: dict[SeriesKey, float] = {(self.queue_capacity, labels): float(max_queue)}
        reference = reference_values(manifest)
        for name, gauge in (("accuracy", self.reference_accuracy), ("ece", self.reference_ece),
                            ("ood_rate", self.reference_ood_rate)):
            if name in reference:
                values[(gauge, labels)] = reference[name]
        calibration = manifest.conformal or (manifest.multi_label.recall if manifest.multi_label else None)
        if calibration is not None:
            values[(self.calibration_inputs, labels)] = float(calibration.n)
        for distribution, gauge in self.reference_distributions.items():
            for q in REFERENCE_QUANTILES:
                value = reference.get(f"{distribution}@{q}")
                if value is not None:
                    values[(gauge, (*labels, str(q)))] = value
        for (count, score), threshold in ood_thresholds(manifest).items():
            values[(self.ood_threshold, (*labels, count, score))] = threshold
        for key in self._published.get(labels, set()) - set(values):
            self._remove(*key)
        for (gauge, series), value in values.items():
            gauge.labels(*series).set(value)
        self._published[labels] = set(values)
        # children created at 0: a counter that appears only at its first increment makes rate() miss that one
        for reason in REJECT_REASONS:
            self.rejected.labels(model, version, reason)
        for counter in (self.predictions, self.ood_predictions, self.feedback):
            counter.labels(*labels)
        self._class_labels[labels] = list(manifest.labels)
        for name in self._class_labels[labels]:
            self.class_predictions.labels(*labels, name)
        self.queue_depth.labels(*labels)

    def unpublish_version(self, model: str, version: str) -> None:
        """The version is no longer served: remove its reference and capacity series."""
        for key in self._published.pop((model, version), set()):
            self._remove(*key)
        self._class_labels.pop((model, version), None)

    def published_versions(self) -> set[tuple[str, str]]:
        return set(self._published)

    def set_model_info(self, series: Iterable[tuple[str, str, str, str]]) -> None:
        """``director_model_info`` = 1 for exactly these (model, version, method, state) label sets."""
        current = set(series)
        for labels in self._info - current:
            self._remove(self.model_info, labels)
        for labels in current:
            self.model_info.labels(*labels).set(1)
        self._info = current

    def _remove(self, gauge: Gauge, labels: tuple[str, ...]) -> None:
        if multiprocess_dir() is None:
            gauge.remove(*labels)
        else:  # the shared file keeps every series it ever held: NaN marks it removed, expose() drops it
            gauge.labels(*labels).set(math.nan)

    def expose(self) -> bytes:
        directory = multiprocess_dir()
        return generate_latest(self.registry) if directory is None else expose_workers(directory)
