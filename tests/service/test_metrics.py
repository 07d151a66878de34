"""service/observability/metrics.py on its own: the collectors its registry carries and the series it exposes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from artifact.contract import parse_manifest
from models.uncertainty import UncertaintySummary, summarize
from service.observability.metrics import Metrics
from service.observability.multiprocess import _WorkerProcesses
from tests.repository_facts import WHOLE_STACK_DIRECTOR_DIR
from tests.service.conftest import metric_value


@pytest.mark.parametrize("multiprocess", [False, True])
def test_gpu_memory_is_the_device_s_used_and_total_at_scrape_time(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                                  multiprocess: bool) -> None:
    """On a CUDA process the driver's view (total minus free, every process on the device) and the total; the
    GPU memory alert divides them. Exposed in multiprocess mode too (DIRECTOR_WORKERS > 1), where /metrics is
    built from the shared files. Faked here: no GPU on this machine."""
    if multiprocess:
        monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (30 * 2**30, 80 * 2**30))
    text = Metrics().expose().decode()
    assert metric_value(text, "director_gpu_memory_used_bytes") == 50 * 2**30
    assert metric_value(text, "director_gpu_memory_total_bytes") == 80 * 2**30


def test_gpu_memory_of_a_cpu_process_has_names_but_no_samples(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process that never initialised CUDA exports the families empty (the dashboard and rules name real
    metrics) and does not initialise CUDA to read them."""
    def fail() -> tuple[int, int]:
        raise AssertionError("mem_get_info would initialise CUDA")

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "mem_get_info", fail)
    text = Metrics().expose().decode()
    assert "# TYPE director_gpu_memory_used_bytes gauge" in text
    assert metric_value(text, "director_gpu_memory_used_bytes") is None
    assert metric_value(text, "director_gpu_memory_total_bytes") is None


def test_process_gc_and_platform_collectors_and_no_created_series() -> None:
    text = Metrics().expose().decode()
    for name in ("process_resident_memory_bytes", "process_cpu_seconds_total", "process_open_fds",
                 "python_gc_collections_total", "python_info"):
        assert f"\n{name}" in text, name
    assert "_created" not in text  # disable_created_metrics: one series per counter, not two


def summary_of(predictions: list[int], classes: int) -> UncertaintySummary:
    logits = torch.full((2, len(predictions), classes), -5.0)  # [S, B, C]
    for row, index in enumerate(predictions):
        logits[:, row, index] = 5.0
    return summarize(logits)


def test_per_class_counter_is_bounded_by_the_manifest_labels() -> None:
    """Every label of a ready version's manifest exists at 0 from its load; predictions count under their label;
    a class index the manifest does not name counts as `unknown`, so the label set stays bounded."""
    metrics = Metrics()
    manifest = parse_manifest(json.loads((WHOLE_STACK_DIRECTOR_DIR / "manifest.json").read_text()))
    metrics.publish_version("m", "1", manifest.model_copy(update={"labels": ["cat", "dog", "eel"]}), max_queue=4)
    text = metrics.expose().decode()
    for label in ("cat", "dog", "eel"):
        assert metric_value(text, "director_class_predictions_total", model="m", version="1", label=label) == 0.0
    metrics.observe_summary("m", "1", summary_of([1, 1, 2, 1], classes=3), [0.0] * 4, [False] * 4, [0.5] * 4)
    metrics.observe_summary("m", "1", summary_of([3], classes=4), [0.0], [False], [0.5])  # not in the manifest
    text = metrics.expose().decode()
    counts = {label: metric_value(text, "director_class_predictions_total", model="m", version="1", label=label)
              for label in ("cat", "dog", "eel", "unknown")}
    assert counts == {"cat": 0.0, "dog": 3.0, "eel": 1.0, "unknown": 1.0}
    assert metric_value(text, "director_predictions_total", model="m", version="1") == 5.0
    labels = {line.split('label="')[1].split('"')[0] for line in text.splitlines()
              if line.startswith("director_class_predictions_total{")}
    assert labels == {"cat", "dog", "eel", "unknown"}


def test_worker_processes_are_reported_per_live_pid(tmp_path: Path) -> None:
    """Multiprocess mode: process_* of every worker whose pid names a file of the shared directory and still
    runs, labelled pid; a dead worker's leftover files add nothing."""
    dead = 2**22 + 12345  # above the default pid_max: no such process
    for name in (f"counter_{os.getpid()}.db", f"gauge_livesum_{os.getpid()}.db", f"counter_{dead}.db"):
        (tmp_path / name).write_bytes(b"")
    families = {family.name: family for family in _WorkerProcesses(str(tmp_path)).collect()}
    assert {"process_resident_memory_bytes", "process_cpu_seconds", "process_open_fds"} <= set(families)
    for family in families.values():
        assert {sample.labels["pid"] for sample in family.samples} == {str(os.getpid())}, family.name
    assert families["process_resident_memory_bytes"].samples[0].value > 0
