"""Metrics of a server with several worker processes (prometheus-client's multiprocess mode): every worker writes
its series to files in ``PROMETHEUS_MULTIPROC_DIR``, and a scrape, answered by any worker, reads them all."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterator
from pathlib import Path

from prometheus_client import PLATFORM_COLLECTOR, CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client import multiprocess as prom_multiprocess
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from service.observability.gpu_metrics import GpuMemoryCollector, GpuUtilisationCollector


def multiprocess_dir() -> str | None:
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


def expose_workers(directory: str) -> bytes:
    """Every worker's series (gauges marked removed left out), each live worker's ``process_*`` labelled ``pid``,
    and the device-wide series, the same whichever worker answers the scrape."""
    registry = CollectorRegistry()
    registry.register(_WithoutRemoved(prom_multiprocess.MultiProcessCollector(None, path=directory)))
    registry.register(_WorkerProcesses(directory))
    registry.register(PLATFORM_COLLECTOR)
    registry.register(GpuMemoryCollector())
    registry.register(GpuUtilisationCollector())
    return generate_latest(registry)


_WORKER_FILE = re.compile(r"_(\d+)\.db$")


class _WorkerProcesses(Collector):
    """``process_*`` of every live worker of a multiprocess server, labelled ``pid``: the workers are the pids in
    the shared directory's file names whose process still exists (read from ``/proc``, as the single-process
    collector reads its own)."""

    def __init__(self, directory: str) -> None:
        self.directory = Path(directory)

    def collect(self) -> Iterator[Metric]:
        pids = sorted({int(m.group(1)) for f in self.directory.glob("*.db") if (m := _WORKER_FILE.search(f.name))})
        families: dict[str, Metric] = {}
        for pid in pids:
            if not Path(f"/proc/{pid}").exists():
                continue
            for metric in ProcessCollector(pid=lambda pid=pid: pid, registry=None).collect():
                family = families.setdefault(metric.name, Metric(metric.name, metric.documentation, metric.type,
                                                                 metric.unit))
                for sample in metric.samples:
                    family.add_sample(sample.name, {**sample.labels, "pid": str(pid)}, sample.value)
        yield from families.values()


class _WithoutRemoved(Collector):
    """The multiprocess collector minus gauge samples marked removed (NaN, see ``Metrics._remove``)."""

    def __init__(self, collector: prom_multiprocess.MultiProcessCollector) -> None:
        self.collector = collector

    def collect(self) -> Iterator[Metric]:
        for metric in self.collector.collect():
            if metric.type == "gauge":
                metric.samples = [s for s in metric.samples if not math.isnan(s.value)]
            yield metric


def mark_process_dead() -> None:
    if multiprocess_dir() is not None:
        prom_multiprocess.mark_process_dead(os.getpid())
