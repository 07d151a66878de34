"""``benchmarks/forward_parts.py`` on the committed fashion-vit v7 and its deterministic baseline: the parts it times
are the ones ``scored_rows`` computes (the feature scorer on the timed parts' features gives the served columns), and
one short round gives a page with every part and the floor."""

from __future__ import annotations

import argparse

import torch

from benchmarks.forward_parts import floor_ms, markdown, measure, timings
from benchmarks.timing import scripted_module
from tests.service.conftest import REPO_ROOT

DIRECTOR = REPO_ROOT / "model_repository" / "fashion-vit" / "7"
DETERMINISTIC = REPO_ROOT / "model_repository" / "fashion-vit-deterministic" / "2"


def test_the_timed_parts_are_what_scored_rows_computes() -> None:
    director = scripted_module(DIRECTOR, "cpu")
    calls = timings(director, scripted_module(DETERMINISTIC, "cpu"), (1, 28, 28), batch=3, seed=0)
    with torch.no_grad():
        outputs = {name: call() for name, call in calls.items()}
        _, scores = outputs["DIRECTOR scored_rows"]  # [3, 1 + F]
    torch.testing.assert_close(outputs["feature scorer"], scores[:, 1:], rtol=1e-5, atol=1e-5)
    assert outputs["readout"].shape == (3, 10) and outputs["deterministic sample_rows"].shape == (3, 10)


def test_one_round_gives_every_part_and_the_floor() -> None:
    args = argparse.Namespace(director=DIRECTOR, deterministic=DETERMINISTIC, batches=[2], rounds=1, seconds=0.0,
                              threads=1, seed=0)
    results = {**measure(args), "command": "python -m benchmarks.forward_parts"}
    parts = results["batches"]["2"]
    assert len(parts) == 10 and all(p["median"] > 0 for p in parts.values())
    page = "\n".join(markdown(results))
    assert "### 2 image(s) per forward" in page and f"{floor_ms(parts):.3f} ms" in page
