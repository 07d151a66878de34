"""Live coverage and selective risk over HTTP: a real server on the tiny export's conformal part answers /predict with
``coverage`` and ``max_risk``, labels come back through /feedback, and the gauges on /metrics equal what the responses
and labels give, per requested level, on the embedded SQLite store and on PostgreSQL."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from artifact.conformal import CONFORMAL_FILE
from artifact.contract import MANIFEST
from tests.service.conftest import (
    Running,
    copy_version,
    metric_value,
    random_pixels,
    rehash,
    serve,
    settings_for,
    wait_for,
)

TINY = {"model": "tiny", "version": "1"}
# what the test asks: two coverage levels, two risk levels; every input of the first request is answered
# random pixels look shifted to the tiny model: the shift guard off, so the calibrated sets and thresholds answer
ASKS = [{"coverage": 0.9, "max_risk": 0.5, "abstain_if_ood": False, "widen_if_shifted": False},
        {"coverage": 0.8, "conformal_score": "lac", "max_risk": 0.25, "widen_if_shifted": False}]


def with_thresholds(source: Path, target: Path, thresholds: dict[str, float]) -> Path:
    """A copy of the tiny export whose selective thresholds at some risk levels are set by hand: the tiny model is
    too inaccurate for any level to have one (every input would abstain, leaving selective risk nothing to count)."""
    shutil.copytree(source, target)
    document = json.loads((target / CONFORMAL_FILE).read_text())
    document["selective"]["thresholds"].update(thresholds)
    (target / CONFORMAL_FILE).write_text(json.dumps(document) + "\n")
    rehash(target, json.loads((target / MANIFEST).read_text()))
    return target


@pytest.fixture(scope="module")
def answering_artifact(tiny_artifact: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    # 0.5: every input answered; 0.25: those with a confidence of at least 0.15 (a tiny model's spread straddles it)
    return with_thresholds(tiny_artifact, tmp_path_factory.mktemp("answering") / "tiny", {"0.5": 0.0, "0.25": 0.15})


def predict(url: str, ask: dict[str, Any], seed: int, n: int = 8) -> dict[str, Any]:
    inputs = [{"pixels": p} for p in random_pixels(np.random.default_rng(seed), n)]
    response = httpx.post(f"{url}/predict", json={"inputs": inputs, **ask}, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def true_label(prediction: dict[str, Any], labels: list[str], i: int) -> str:
    """The predicted label (in its set, right) for every fourth input, the set's last label for the next even one,
    a label outside the set (when it leaves one out) for odd ones: sets that hold the truth or not, answers right or
    wrong."""
    chosen = prediction["prediction_set"]
    outside = [name for name in labels if name not in chosen]
    if i % 4 == 0:
        return str(prediction["label"])
    return chosen[-1] if i % 2 == 0 or not outside else outside[0]


def label_all(url: str, out: dict[str, Any], labels: list[str]) -> list[str]:
    """Send a label for every input of ``out`` (names for some, indices for others); returns the labels."""
    sent = []
    for i, prediction in enumerate(out["predictions"]):
        truth = true_label(prediction, labels, i)
        label: str | int = truth if i % 3 else labels.index(truth)
        response = httpx.post(f"{url}/feedback", json={"id": out["id"], "index": i, "label": label}, timeout=30)
        assert response.status_code == 200, response.text
        sent.append(truth)
    return sent


def expected(outs: list[dict[str, Any]], truths: list[list[str]]) -> dict[tuple[str, str], tuple[float, float]]:
    """(gauge family, level) -> (value, count), from the responses and the labels alone."""
    found: dict[tuple[str, str], list[int]] = {}
    for out, sent in zip(outs, truths, strict=True):
        coverage, max_risk = (repr(float(out["decisions"][k])) for k in ("coverage", "max_risk"))
        for prediction, truth in zip(out["predictions"], sent, strict=True):
            found.setdefault(("coverage", coverage), []).append(truth in prediction["prediction_set"])
            if not prediction["abstain"]:
                found.setdefault(("selective_risk", max_risk), []).append(truth != prediction["label"])
    return {key: (sum(hits) / len(hits), float(len(hits))) for key, hits in found.items()}


def gauges(text: str, kind: str, level: str) -> tuple[float | None, float | None, float | None]:
    label = {"coverage": "coverage", "selective_risk": "max_risk"}[kind]
    bound = {"coverage": "target", "selective_risk": "bound"}[kind]
    return tuple(metric_value(text, f"director_live_{kind}_{suffix}", **TINY, **{label: level})  # type: ignore
                 for suffix in ("ratio", "count", f"{bound}_ratio"))


def check_live_gauges(server: Running) -> dict[tuple[str, str], tuple[float, float]]:
    outs = [predict(server.url, ask, seed=20 + n) for n, ask in enumerate(ASKS)]
    labels = list(outs[0]["predictions"][0]["probabilities"])
    truths = [label_all(server.url, out, labels) for out in outs]
    want = expected(outs, truths)
    assert {kind for kind, _ in want} == {"coverage", "selective_risk"}  # both kinds have labelled inputs
    assert ("selective_risk", "0.5") in want and want[("selective_risk", "0.5")][1] == 8  # every input answered
    assert 0 < want[("coverage", "0.9")][0] < 1 and 0 < want[("selective_risk", "0.5")][0] < 1  # a mix of each

    def shown() -> bool:
        text = httpx.get(f"{server.url}/metrics", timeout=30).text
        return all(gauges(text, kind, level) == (value, count, float(level))
                   for (kind, level), (value, count) in want.items())

    wait_for(shown, "live coverage and selective risk on /metrics", timeout_s=30)
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    if ("selective_risk", "0.25") not in want:  # nobody answered at 0.25: no series, not a 0 out of nothing
        assert gauges(text, "selective_risk", "0.25") == (None, None, None)
    assert metric_value(text, "director_reference_calibration_inputs", **TINY) == 75.0  # the tiny export's split
    return want


def test_live_coverage_and_selective_risk_follow_the_labels(answering_artifact: Path, tmp_path: Path) -> None:
    repository = tmp_path / "repository"
    copy_version(answering_artifact, repository, "tiny", "1")
    settings = settings_for(repository, tmp_path)
    with serve(settings) as server:
        want = check_live_gauges(server)
        unasked = predict(server.url, {}, seed=30, n=2)  # neither asked: accuracy moves, no level does
        response = httpx.post(f"{server.url}/feedback", json={"id": unasked["id"], "index": 0, "label": 0})
        assert response.status_code == 200 and response.json()["labelled"] == 17
        text = httpx.get(f"{server.url}/metrics", timeout=30).text
        assert all(gauges(text, kind, level)[1] == count for (kind, level), (_, count) in want.items())
    with serve(settings) as restarted:  # read from the store, not kept in the process
        text = httpx.get(f"{restarted.url}/metrics", timeout=30).text
        assert all(gauges(text, kind, level)[:2] == value for (kind, level), value in want.items())


def test_live_coverage_and_selective_risk_on_postgres(answering_artifact: Path, tmp_path: Path,
                                                      postgres_cluster: Any) -> None:
    repository = tmp_path / "repository"
    copy_version(answering_artifact, repository, "tiny", "1")
    url = postgres_cluster.create_database("live_decisions")
    with serve(settings_for(repository, tmp_path, feedback_url=url)) as server:
        check_live_gauges(server)
