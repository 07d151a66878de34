"""Feedback store faults staged on a real server with its real SQLite file: locked by another connection, full
(SQLite's own "database or disk is full", from a page budget set on the server's connection) and read-only (SQLite's
own read-only error: root ignores file modes). During each one every prediction is answered, ``/feedback`` gets 503
with ``Retry-After``, ``/metrics`` and readiness answer; afterwards ``/feedback`` works again and every prediction
made during the fault is in the file, none dropped. (PostgreSQL down: ``test_feedback_postgres``.)"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np
import pytest

from service.feedback.calls import StoreCalls
from service.feedback.sqlite import SqliteFeedbackStore
from service.feedback.store import FeedbackUnavailable
from service.state import AppState
from tests.service.conftest import metric_value, random_pixels, serve, settings_for, wait_for

DURING = 20  # predictions sent during each fault
INPUTS = 16  # inputs per prediction: enough rows that the log cannot fit in the pages the full store has left
LABELS = 10  # /feedback calls sent during each fault


@contextmanager
def store_fault(kind: str, state: AppState, database: Path) -> Iterator[None]:
    store = state.feedback
    assert isinstance(store, SqliteFeedbackStore)
    if kind == "locked":
        with sqlite3.connect(database, timeout=1) as locker:
            locker.execute("BEGIN EXCLUSIVE")  # writers and readers wait on it
            try:
                yield
            finally:
                locker.rollback()
        return
    on, off = {"full": ("max_page_count = {pages}", "max_page_count = 1073741823"),
               "read_only": ("query_only = ON", "query_only = OFF")}[kind]
    with store._lock:
        pages = store._conn.execute("PRAGMA page_count").fetchone()[0]
        store._conn.execute("PRAGMA " + on.format(pages=pages))
    try:
        yield
    finally:
        with store._lock:
            store._conn.execute("PRAGMA " + off)


def label(url: str, prediction: str) -> httpx.Response:
    return httpx.post(f"{url}/feedback", json={"id": prediction, "index": 0, "label": 1}, timeout=30)


@pytest.mark.parametrize("kind", ["locked", "full", "read_only"])
def test_a_store_fault_stops_feedback_not_predictions_and_the_log_recovers(kind: str, tiny_repository: Path,
                                                                          tmp_path: Path) -> None:
    database = tmp_path / "feedback.sqlite3"
    settings = settings_for(tiny_repository, tmp_path, feedback_timeout_s=0.5, feedback_threads=1)
    with serve(settings) as server:
        state = server.app_state
        body = {"inputs": [{"pixels": p} for p in random_pixels(np.random.default_rng(0), INPUTS)], "n_samples": 2}
        with httpx.Client(base_url=server.url, timeout=30) as client:
            before = client.post("/predict", json=body).json()["id"]
            assert label(server.url, before).status_code == 200  # the store works, and the row is written
            with store_fault(kind, state, database):
                predicted = [client.post("/predict", json=body).status_code for _ in range(DURING)]
                wait_for(lambda: state.store_calls.failing, "the prediction log's flush to fail", timeout_s=30)
                refused = [label(server.url, before) for _ in range(LABELS)]
                scrapes = [client.get("/metrics") for _ in range(3)]
                ready = client.get("/health/ready").status_code
                pending = state.feedback.pending
        assert predicted == [200] * DURING
        assert [(r.status_code, r.headers.get("retry-after")) for r in refused] == [(503, "5")] * LABELS
        assert all(r.json()["type"] == "unavailable" for r in refused)
        # SQLite's own error (a lock: its busy timeout is the call's, so the call's own limit may come first)
        because = {"locked": ("database is locked", "did not answer within"), "full": ("database or disk is full",),
                   "read_only": ("readonly",)}[kind]
        assert all(any(b in r.json()["error"] for b in because) for r in refused), refused[-1].text
        assert [s.status_code for s in scrapes] == [200] * 3 and ready == 200
        assert metric_value(scrapes[-1].text, "director_feedback_store_up") == 0.0  # the outage shows
        assert pending > 0  # the log waited in memory

        answers: list[httpx.Response] = []  # the store is tried again within a second of the fault's end
        wait_for(lambda: answers.append(label(server.url, before)) or answers[-1].status_code != 503,
                 "the store to be tried again", timeout_s=30, poll_s=0.2)
        answer = answers[-1]
        assert answer.status_code == 200, answer.text
        wait_for(lambda: state.feedback.pending == 0, "the prediction log to be written")
        with sqlite3.connect(database) as reader:
            rows = reader.execute("SELECT COUNT(*) FROM predictions").fetchone()[0]
        assert rows == (1 + DURING) * INPUTS and state.feedback.dropped == 0
        text = httpx.get(f"{server.url}/metrics", timeout=30).text
        assert metric_value(text, "director_prediction_log_dropped_total") == 0
        assert metric_value(text, "director_feedback_store_up") == 1.0


def test_a_failing_store_is_not_asked_again_until_its_retry_interval(tmp_path: Path) -> None:
    """After a failure every call is refused at once (it never reaches the store) until ``retry_s`` has passed; then
    a single call tries the store, and its success lets the others through again."""
    store = SqliteFeedbackStore(tmp_path / "f.sqlite3", max_rows=100, max_age_s=3600, window=100)
    store.log("a", "m", "1", 1, [(0, "x", 0.9)])
    store.flush()
    now = [0.0]
    calls = StoreCalls(threads=1, timeout_s=5, retry_s=1.0, clock=lambda: now[0])
    reached: list[str] = []

    def record() -> None:
        reached.append("record")
        store.record("a", 0, True)

    async def scenario() -> list[str]:
        outcomes = []
        for step, at in (("read-only", 0.0), ("refused", 0.5), ("still read-only", 1.0), ("refused", 1.5),
                         ("writable", 2.1), ("writable", 2.2)):
            now[0] = at
            store._conn.execute(f"PRAGMA query_only = {'OFF' if step == 'writable' else 'ON'}")
            try:
                await calls.run(record)
                outcomes.append("ok")
            except FeedbackUnavailable as exc:
                outcomes.append("refused at once" if "tried again every 1 s" in str(exc) else "failed")
        return outcomes

    try:
        assert asyncio.run(scenario()) == ["failed", "refused at once", "failed", "refused at once", "ok", "ok"]
        assert len(reached) == 4 and not calls.failing
    finally:
        calls.close()
        store.close()
