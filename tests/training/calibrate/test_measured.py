"""The run's peak memory is its own: the high-water mark of its address space, not ``ru_maxrss``, which a process
started from a large one (a test session, a notebook) inherits from it across the fork."""

from __future__ import annotations

import resource
from pathlib import Path

from training.calibrate.measured import own_peak_rss_bytes, peak_rss_bytes


def test_the_own_peak_is_vmhwm_and_ru_maxrss_without_it(tmp_path: Path) -> None:
    status = tmp_path / "status"
    status.write_text("Name:\tpython\nVmPeak:\t 9000000 kB\nVmHWM:\t  123456 kB\nVmRSS:\t  100000 kB\n")
    assert own_peak_rss_bytes(status) == 123456 * 1024
    assert own_peak_rss_bytes(tmp_path / "missing") == resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    assert peak_rss_bytes() >= own_peak_rss_bytes() > 0  # this process's, or a finished child's when larger
