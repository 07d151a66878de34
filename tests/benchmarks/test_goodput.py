"""The goodput benchmark: one burst against a real server serving the committed vision default, its answers tallied,
and the page's table."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

from benchmarks.goodput import burst, request_body, section
from benchmarks.server import running_server

REPOSITORY = Path(__file__).resolve().parents[2] / "model_repository"


def test_a_burst_is_tallied_by_status_and_goodput_counts_answered_inputs_only(tmp_path: Path) -> None:
    repository = tmp_path / "repo"
    shutil.copytree(REPOSITORY / "fashion-vit" / "8", repository / "fashion-vit" / "8")  # links may not leave it
    body = request_body("fashion-vit", 4, 1, text=False)
    assert len(body["inputs"]) == 4 and len(body["inputs"][0]["pixels"]) == 28
    with running_server(repository, "fashion-vit", 1, []) as url:
        point = asyncio.run(burst(url, body, 3, timeout_s=30.0))
    assert point["codes"] == {"200": 3} and point["clients"] == 3
    assert point["answered_inputs"] == 12 and point["goodput_inputs_per_s"] > 0  # 3 answers of 4 inputs each


def test_the_page_table_counts_answers_refusals_and_timeouts() -> None:
    results = {"model": "m", "inputs": 64, "n_samples": 4, "timeout_s": 30.0, "threads": 1, "date": "d",
               "sequential_inputs_per_s": 20.0, "command": "python -m benchmarks.goodput",
               "points": [{"clients": 20, "codes": {"200": 8, "503": 12}, "wall_s": 25.0,
                           "goodput_inputs_per_s": 20.48, "vs_sequential": 1.02}]}
    assert "| 20 | 8 | 12 | 0 | 25 | 20.48 | 1.02x |" in section(results)
