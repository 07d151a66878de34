"""What a calibrate run measured, beside what its plan estimated: each stage's seconds and the peak resident memory
(this process's, or its torchrun children's when larger), printed at the end and kept in ``runs/NAME/estimates.json``
so the estimates can be checked against runs (docs/your-own-model.md)."""

from __future__ import annotations

import json
import resource
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from training.calibrate.plan import Plan, duration, gib

ESTIMATES_FILE = "estimates.json"


def peak_rss_bytes() -> int:
    """The peak resident memory of this program or of its largest finished child (torchrun's ranks).

    This program's own is the kernel's high-water mark of its address space (``VmHWM``): ``ru_maxrss`` would also
    count the process it was started from, whose address space a forked child holds until it executes this one (a
    calibrate started by a 3 GiB test session read 3 GiB)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # Linux reports KiB
    return max(own_peak_rss_bytes(), children)


def own_peak_rss_bytes(status: Path = Path("/proc/self/status")) -> int:
    """``VmHWM`` of ``status``; ``ru_maxrss`` where the file is missing (not Linux)."""
    try:
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


@dataclass
class Measured:
    """Seconds per stage (fit, distil, export), as the run went."""

    seconds: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

    @property
    def total(self) -> float:
        return sum(self.seconds.values())


def comparison(plan: Plan, measured: Measured) -> dict[str, Any]:
    """The plan's estimates and the run's measurements, side by side (seconds and bytes)."""
    seconds = plan.seconds
    estimated = {"fit": seconds.fit, "distil": seconds.distil, "export": seconds.export, "total": seconds.total}
    return {"estimated": {"seconds": estimated, "peak_memory_bytes": plan.memory_bytes},
            "measured": {"seconds": {**measured.seconds, "total": measured.total},
                         "peak_memory_bytes": peak_rss_bytes()}}


def comparison_line(record: dict[str, Any]) -> str:
    """One line: each stage's estimated and measured time, then the peak memory."""
    est, got = record["estimated"]["seconds"], record["measured"]["seconds"]
    stages = ", ".join(f"{name} {duration(est[key])} / {duration(got.get(key, 0.0))}"
                       for name, key in (("fit-backbone", "fit"), ("distillation", "distil"), ("export", "export")))
    return (f"estimated / measured: time {duration(est['total'])} / {duration(got['total'])} ({stages}); peak memory "
            f"{gib(record['estimated']['peak_memory_bytes'])} / {gib(record['measured']['peak_memory_bytes'])}")


def write_comparison(run_dir: Path, record: dict[str, Any]) -> None:
    (run_dir / ESTIMATES_FILE).write_text(json.dumps(record, indent=2) + "\n")
