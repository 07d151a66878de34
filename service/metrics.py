"""Prometheus metrics (prefix ``director_``, base units). Labels ``model`` and ``version`` are bounded:
names the repository does not know are counted as ``unknown``. When ``PROMETHEUS_MULTIPROC_DIR`` is set
(several uvicorn workers) values live in the shared directory and ``/metrics`` aggregates them."""

from __future__ import annotations

import os

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import multiprocess as prom_multiprocess

from models.uncertainty import UncertaintySummary

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
CONFIDENCE_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0)
ENTROPY_BUCKETS = (0.01, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0)
MI_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0)
OOD_BUCKETS = (-20.0, -15.0, -10.0, -7.5, -5.0, -2.5, -1.0, 0.0, 0.01, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5,
               2.0, 3.0, 5.0)
MV = ("model", "version")
UNKNOWN = "unknown"


def multiprocess_dir() -> str | None:
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("director_requests_total", "HTTP requests by route template and status",
                                ["endpoint", "code"], registry=r)
        self.request_duration = Histogram("director_request_duration_seconds", "HTTP request latency",
                                          ["endpoint"], buckets=LATENCY_BUCKETS, registry=r)
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
        self.queue_depth = Gauge("director_queue_depth", "requests waiting for a batch", MV, registry=r,
                                 multiprocess_mode="livesum")
        self.rejected = Counter("director_rejected_requests_total", "requests refused (queue_full, timeout, "
                                "draining)", [*MV, "reason"], registry=r)
        self.predictions = Counter("director_predictions_total", "inputs predicted", MV, registry=r)
        self.ood_predictions = Counter("director_ood_predictions_total", "inputs flagged out-of-distribution",
                                       MV, registry=r)
        self.confidence = Histogram("director_prediction_confidence", "max of the mean probability", MV,
                                    buckets=CONFIDENCE_BUCKETS, registry=r)
        self.entropy = Histogram("director_predictive_entropy_nats", "entropy of the mean probability", MV,
                                 buckets=ENTROPY_BUCKETS, registry=r)
        self.mutual_information = Histogram("director_mutual_information_nats", "predictive minus expected "
                                            "entropy", MV, buckets=MI_BUCKETS, registry=r)
        self.ood_score = Histogram("director_ood_score", "the manifest's OOD score (higher = more OOD)", MV,
                                   buckets=OOD_BUCKETS, registry=r)
        self.drift_ks = Gauge("director_confidence_drift_ks", "KS distance of live confidences (default sample "
                              "count) to the reference", MV, registry=r, multiprocess_mode="livemostrecent")
        self.drift_psi = Gauge("director_confidence_drift_psi", "PSI of live confidences over the reference "
                               "deciles", MV, registry=r, multiprocess_mode="livemostrecent")
        self.feedback = Counter("director_feedback_total", "ground-truth labels received", MV, registry=r)
        self.live_accuracy = Gauge("director_live_accuracy", "accuracy over the latest labelled predictions", MV,
                                   registry=r, multiprocess_mode="mostrecent")
        self.live_ece = Gauge("director_live_ece", "ECE over the latest labelled predictions", MV, registry=r,
                              multiprocess_mode="mostrecent")
        self.gpu_memory = Gauge("director_gpu_memory_allocated_bytes", "torch CUDA memory allocated", registry=r,
                                multiprocess_mode="livesum")
        self.model_info = Gauge("director_model_info", "1 per served model version, with its state", [
            *MV, "method", "state"], registry=r, multiprocess_mode="livemax")

    def observe_summary(self, model: str, version: str, summary: UncertaintySummary, ood: list[float],
                        flags: list[bool]) -> None:
        labels = (model, version)
        self.predictions.labels(*labels).inc(len(flags))
        flagged = sum(flags)
        self.ood_predictions.labels(*labels).inc(flagged)  # inc(0) still creates the series
        for values, hist in ((summary.confidence.tolist(), self.confidence),
                             (summary.predictive_entropy.tolist(), self.entropy),
                             (summary.mutual_information.tolist(), self.mutual_information),
                             (ood, self.ood_score)):
            child = hist.labels(*labels)
            for value in values:
                child.observe(value)

    def expose(self) -> bytes:
        directory = multiprocess_dir()
        if directory is None:
            return generate_latest(self.registry)
        registry = CollectorRegistry()
        prom_multiprocess.MultiProcessCollector(registry, path=directory)
        return generate_latest(registry)


def mark_process_dead() -> None:
    if multiprocess_dir() is not None:
        prom_multiprocess.mark_process_dead(os.getpid())
