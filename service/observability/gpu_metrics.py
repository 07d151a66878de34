"""Device-wide GPU metrics read at scrape time (memory through torch, utilisation through NVML). Being device-wide,
they need no multiprocess aggregation: every worker of a replica reports the same device."""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Iterator

import torch
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

log = logging.getLogger("service.observability.metrics")


class GpuMemoryCollector(Collector):
    """Memory of the CUDA device this process serves on, as the driver reports it at scrape time: in use by every
    process on the device (``director_gpu_memory_used_bytes``: the workers' allocated and cached memory, their
    CUDA contexts, and any other tenant) and its total (``director_gpu_memory_total_bytes``); the GPU memory alert
    is their ratio. Being device-wide, the values need no multiprocess aggregation. A process that never
    initialised CUDA (CPU serving) exports the two families without samples, and never initialises it here."""

    def collect(self) -> Iterator[Metric]:
        used = GaugeMetricFamily("director_gpu_memory_used_bytes", "memory in use on the serving GPU by every "
                                 "process on it (driver view: total minus free)")
        total = GaugeMetricFamily("director_gpu_memory_total_bytes", "total memory of the serving GPU")
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            free_bytes, total_bytes = torch.cuda.mem_get_info()
            used.add_metric([], float(total_bytes - free_bytes))
            total.add_metric([], float(total_bytes))
        yield used
        yield total


class GpuUtilisationCollector(Collector):
    """Share of the last sample period in which the serving GPU ran a kernel (``director_gpu_utilization_ratio``,
    device-wide like the memory above), read through NVML (``nvidia-ml-py``) at scrape time. Without NVML, or in a
    process that never initialised CUDA, the family has no sample."""

    def __init__(self) -> None:
        self.nvml = importlib.util.find_spec("pynvml") is not None

    def collect(self) -> Iterator[Metric]:
        ratio = GaugeMetricFamily("director_gpu_utilization_ratio", "share of time the serving GPU was busy (NVML)")
        if self.nvml and torch.cuda.is_available() and torch.cuda.is_initialized():
            try:
                ratio.add_metric([], torch.cuda.utilization() / 100.0)
            except Exception:  # NVML errors (driver reloaded, device lost) leave the sample out, never the scrape
                log.debug("NVML utilisation unavailable", exc_info=True)
        yield ratio
