"""The estimates benchmark's pieces: the walk-through's data cut to a tiny size, and its table of estimated against
measured (the runs themselves are the benchmark's, minutes each)."""

from __future__ import annotations

import csv
from pathlib import Path

from benchmarks.calibrate_estimates import markdown, write_sources


def test_a_tiny_size_keeps_the_first_rows_of_each_source(tmp_path: Path) -> None:
    assert write_sources(tmp_path / "sources.csv", 4) == 12
    with (tmp_path / "sources.csv").open(newline="") as handle:
        rows = list(csv.reader(handle))
    assert rows[0] == ["sentence", "source"]
    assert sorted(source for _, source in rows[1:]) == ["editorial"] * 4 + ["product review"] * 4 + ["tweet"] * 4


def test_the_table_gives_each_stage_and_the_ratios() -> None:
    seconds = {"fit": 60.0, "distil": 120.0, "export": 60.0, "total": 240.0}
    record = {"estimated": {"seconds": seconds, "peak_memory_bytes": 2**30},
              "measured": {"seconds": {k: v / 2 for k, v in seconds.items()}, "peak_memory_bytes": 2**31}}
    page = markdown({"150-threads-default": {"sentences": 450, "threads": None, "runs": [record]}})
    assert "| 450 sentences, threads default, run 1 | 1.0 / 0.5 | 2.0 / 1.0 | 1.0 / 0.5 | 4.0 / 2.0 | 0.50 | " \
           "1.00 / 2.00 GiB | 2.00 |" in page
