"""The version-cost A/B: ratios paired by round against the first version, and one real round over two committed
fashion-vit versions through the server's own inference path (decode, forward, scores, temperature, summaries)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from benchmarks.version_cost import markdown, measure, summarise

REPOSITORY = Path(__file__).resolve().parents[2] / "model_repository"


def test_ratios_are_paired_by_round() -> None:
    results = {"model": "m", "versions": {"3": {"ood_score": "kernel_error", "scored_rows": True,
                                                "temperature_by_score": False},
                                          "5": {"ood_score": "combined", "scored_rows": True,
                                                "temperature_by_score": True}},
               "batches": [1], "n_samples": 1, "threads": 1, "torch": "t", "date": "d", "command": "c",
               "rounds": [{"3": {"1": 2.0}, "5": {"1": 2.2}}, {"3": {"1": 4.0}, "5": {"1": 4.8}}]}
    summary = summarise(results)
    assert summary["5"]["1"]["vs_first"] == {"median": 1.15, "min": 1.1, "max": 1.2}  # 2.2/2 and 4.8/4
    assert summary["5"]["1"]["ms_per_batch"] == {"median": 3.5, "min": 2.2, "max": 4.8}  # not a ratio of medians
    row = "| 5 | combined (scored_rows) | yes | 1 | 3.50 [2.20, 4.80] | 3.500 | 1.15x [1.10, 1.20] |"
    assert row in markdown(results)


def test_one_real_round_over_two_committed_versions() -> None:
    args = argparse.Namespace(repository=str(REPOSITORY), model="fashion-vit", versions=["3", "5"], batches=[1, 2],
                              n_samples=1, rounds=1, seconds=0.05, threads=1, seed=0)
    results = measure(args)
    summary = summarise(results)
    assert results["versions"]["5"]["ood_score"] == "mds" and results["versions"]["5"]["scored_rows"]
    for version in ("3", "5"):
        for batch in ("1", "2"):
            assert summary[version][batch]["ms_per_batch"]["median"] > 0
    assert summary["3"]["1"]["vs_first"]["median"] == pytest.approx(1.0)


def test_a_baseline_of_another_model_is_named_by_its_folder() -> None:
    from benchmarks.version_cost import entry_key, version_folder

    assert version_folder(Path("r"), "fashion-vit", "6") == Path("r/fashion-vit/6")
    assert version_folder(Path("r"), "fashion-vit", "fashion-vit-deterministic/1") == Path(
        "r/fashion-vit-deterministic/1")
    assert entry_key("fashion-vit", ["3", "6"]) == "fashion-vit"  # the entry the targets page reads
    assert entry_key("fashion-vit", ["fashion-vit-deterministic/1", "6"]) == (
        "fashion-vit against fashion-vit-deterministic/1")
