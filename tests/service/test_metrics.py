"""service/metrics.py on its own: the collectors its registry carries and the series it exposes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from service.metrics import Metrics
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
