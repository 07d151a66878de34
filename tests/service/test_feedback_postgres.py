"""Replicas sharing one PostgreSQL feedback store, over real HTTP: two server processes agree on live accuracy and
ECE whichever received the labels, a restart loses nothing, and a database that goes away costs /feedback a 503 but
no prediction."""

from __future__ import annotations

import signal
from pathlib import Path

import httpx
import numpy as np

from tests.service.conftest import metric_value, random_pixels, serve, settings_for, wait_for
from tests.service.pg_cluster import PostgresCluster
from tests.service.test_process import service_process

TINY = {"model": "tiny", "version": "1"}


def predict(url: str, n: int, seed: int) -> dict:
    body = {"inputs": [{"pixels": p} for p in random_pixels(np.random.default_rng(seed), n)], "n_samples": 4}
    response = httpx.post(f"{url}/predict", json=body, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


def label(url: str, out: dict, index: int, right: bool) -> httpx.Response:
    """The true label of ``out``'s input ``index``: the predicted class when ``right``, another one otherwise."""
    predicted = out["predictions"][index]["class_index"]
    return httpx.post(f"{url}/feedback", timeout=30,
                      json={"id": out["id"], "index": index, "label": predicted if right else (predicted + 1) % 10})


def label_on_the_other_replica(url: str, out: dict, index: int, right: bool) -> httpx.Response:
    """``label`` sent to a replica that did not serve ``out``: the serving replica writes its prediction log to the
    shared store every 0.1 s (docs/operations.md), so until then the prediction is unknown here (404, nothing
    recorded) and the label is sent again, for at most 10 s."""
    responses: list[httpx.Response] = []
    wait_for(lambda: responses.append(label(url, out, index, right)) or responses[-1].status_code != 404,
             "the serving replica's prediction log in the shared store", timeout_s=10.0, poll_s=0.05)
    return responses[-1]


def live(url: str) -> tuple[float | None, float | None]:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return (metric_value(text, "director_live_accuracy_ratio", **TINY),
            metric_value(text, "director_live_ece_ratio", **TINY))


def test_two_replicas_share_labels_and_a_restart_loses_nothing(tiny_repository: Path,
                                                               postgres_cluster: PostgresCluster) -> None:
    url = postgres_cluster.create_database("replicas")
    env = {"DIRECTOR_FEEDBACK_URL": url, "DIRECTOR_TORCH_THREADS": "1"}
    args = ["--model-repository", str(tiny_repository), "--default-model", "tiny", "--poll-interval-s", "0",
            "--live-refresh-s", "0.2", "--log-level", "warning"]
    rights = [True, False, True, True, False, True]  # labels 0-2 for replica a's request, 3-5 for b's
    with service_process(args, env) as (_, a), service_process(args, env) as (proc_b, b):
        out_a, out_b = predict(a, 3, seed=1), predict(b, 3, seed=2)
        for n, right in enumerate(rights):  # each label goes to the replica that did not serve the prediction
            out, index, replica = (out_a, n, b) if n < 3 else (out_b, n - 3, a)
            response = label_on_the_other_replica(replica, out, index, right)
            assert response.status_code == 200, response.text
            assert response.json()["correct"] is right and response.json()["labelled"] == n + 1
        accuracy, ece = live(a)
        assert accuracy == sum(rights) / len(rights) and ece is not None
        # b's gauges follow the store on its schedule: the same rows, the same order, equal to the last bit
        wait_for(lambda: live(b) == (accuracy, ece), "replica b's live gauges to read the shared store",
                 timeout_s=30.0, poll_s=0.1)
        assert response.json()["live_accuracy"] == accuracy and response.json()["live_ece"] == ece

        unlabelled = predict(b, 2, seed=3)
        proc_b.send_signal(signal.SIGTERM)  # right after answering: the log is written on the way out
        assert proc_b.wait(timeout=60) in (0, -signal.SIGTERM)
        response = label(a, unlabelled, 1, right=True)
        assert response.status_code == 200, response.text
        assert response.json()["labelled"] == len(rights) + 1
    with service_process(args, env) as (_, restarted):
        wait_for(lambda: live(restarted) == (response.json()["live_accuracy"], response.json()["live_ece"]),
                 "the restarted replica's live gauges to read the shared store", timeout_s=30.0, poll_s=0.1)
        assert label(restarted, unlabelled, 0, right=False).json()["labelled"] == len(rights) + 2


def test_a_database_that_goes_away_fails_feedback_not_predictions(tiny_repository: Path, tmp_path: Path,
                                                                   postgres_cluster: PostgresCluster) -> None:
    url = postgres_cluster.create_database("outage")
    with serve(settings_for(tiny_repository, tmp_path, feedback_url=url)) as server:
        before = predict(server.url, 1, seed=4)
        assert label(server.url, before, 0, right=True).status_code == 200
        postgres_cluster.stop()
        try:
            during = [predict(server.url, 2, seed=5 + i) for i in range(3)]  # logged in memory, waiting
            refused = label(server.url, during[0], 0, right=True)
            assert refused.status_code == 503 and refused.headers["retry-after"] == "5"
            body = refused.json()
            assert body["type"] == "unavailable" and body["status"] == 503
            # the pool's own error, or the store's time limit when the pool is still waiting for a connection
            assert "feedback database is unavailable" in body["error"] or "did not answer within" in body["error"]
            accuracy, ece = live(server.url)  # /metrics answers, with the last values it read
            assert accuracy == 1.0 and ece is not None
            assert httpx.get(f"{server.url}/health/ready", timeout=30).status_code == 200
        finally:
            postgres_cluster.start()
        # back (once the pool has reconnected): what was predicted during the outage was written, and takes labels
        answers: list[httpx.Response] = []
        wait_for(lambda: answers.append(label(server.url, during[0], 1, right=False)) or
                 answers[-1].status_code != 503, "the pool to reconnect", timeout_s=60, poll_s=0.5)
        response = answers[-1]
        for out in during[1:]:
            response = label(server.url, out, 1, right=False)
            assert response.status_code == 200, response.text
        assert response.json()["labelled"] == 4 and response.json()["live_accuracy"] == 0.25
