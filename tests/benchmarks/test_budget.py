"""The budget search (``benchmarks/budget.py``): a point at a time, bracketing then bisecting, and several subjects'
searches run point by point in turn. Measured against a fake server whose p99 crosses the budget at a known rate."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.append(str(Path(__file__).resolve().parents[2] / "benchmarks"))  # budget.py imports its siblings by name

from budget import SENTENCE, RateSearch, body_for, interleaved  # noqa: E402


def fake_server(capacity: float, log: list[tuple[str, float]], label: str):  # noqa: ANN201
    """A measure function: p99 10 ms below ``capacity`` requests/s, 200 ms above; every call logged."""

    def measure(rate: float) -> dict[str, Any]:
        log.append((label, rate))
        p99 = 10.0 if rate <= capacity else 200.0
        return {"codes": {"200": 100}, "transport_errors": 0, "all_p99_ms": p99, "offered_rps": rate}

    return measure


def drive(search: RateSearch, measure) -> None:  # noqa: ANN001
    while search.next_rate is not None:
        search.record(measure(search.next_rate))


def test_a_search_brackets_then_bisects_towards_the_capacity() -> None:
    log: list[tuple[str, float]] = []
    search = RateSearch(start=100.0, budget_ms=50.0, steps=4)
    drive(search, fake_server(300.0, log, "a"))
    rates = [rate for _, rate in log]
    assert rates[:3] == [100.0, 200.0, 400.0]  # doubled up to the first failure
    assert rates[3:] == [300.0, 350.0, 325.0, 312.5]  # four bisections between the best pass and the failure
    assert search.best is not None and search.best["offered_rps"] == 300.0
    assert [p["pass"] for p in search.points] == [True, True, False, True, False, False, False]


def test_a_search_that_fails_at_once_halves_down() -> None:
    log: list[tuple[str, float]] = []
    search = RateSearch(start=100.0, budget_ms=50.0, steps=1)
    drive(search, fake_server(30.0, log, "a"))
    assert [rate for _, rate in log] == [100.0, 50.0, 25.0, 37.5]
    assert search.best is not None and search.best["offered_rps"] == 25.0


def test_a_search_with_no_passing_rate_above_the_floor_has_no_best() -> None:
    search = RateSearch(start=2.0, budget_ms=50.0, steps=4, floor=0.5)
    drive(search, fake_server(0.1, [], "a"))
    assert search.best is None and len(search.points) == 3  # 2, 1, 0.5: no lower rate is tried


def test_subjects_are_searched_point_by_point_in_turn() -> None:
    """Two subjects on one server take turns, each to its own end: the slow one's points and the fast one's
    alternate while both search, and each finds its own capacity."""
    log: list[tuple[str, float]] = []
    slow, fast = RateSearch(100.0, 50.0, 2), RateSearch(100.0, 50.0, 2)
    interleaved([("slow", slow, fake_server(150.0, log, "slow")), ("fast", fast, fake_server(700.0, log, "fast"))])
    labels = [label for label, _ in log]
    assert labels[:6] == ["slow", "fast"] * 3
    assert slow.best is not None and slow.best["offered_rps"] == 150.0
    assert fast.best is not None and fast.best["offered_rps"] == 700.0
    assert sum(label == "slow" for label in labels) == len(slow.points)
    assert sum(label == "fast" for label in labels) == len(fast.points)


def test_the_request_follows_the_models_modality() -> None:
    image = {"modality": "image", "input": {"channels": 1, "height": 4, "width": 3}}
    pixels = body_for(image, "fashion-vit", 16)
    assert pixels["model"] == "fashion-vit" and pixels["n_samples"] == 16
    item = pixels["inputs"][0]["pixels"]
    assert (len(item), len(item[0]), len(item[0][0])) == (1, 4, 3)
    assert body_for(image, "fashion-vit", 16) == pixels  # seeded: every subject sends the same input
    text = body_for({"modality": "text", "input": {"max_length": 128}}, "movie-reviews-minilm", 1)
    assert text["inputs"] == [{"text": SENTENCE}] and text["n_samples"] == 1
