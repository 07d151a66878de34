"""Feedback (live accuracy and ECE, surviving a restart), drift gauges, OOD counters and /metrics."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import pytest

from service.feedback.postgres import PostgresFeedbackStore
from service.feedback.sqlite import SqliteFeedbackStore
from service.feedback.store import FLUSH_CHUNK, FeedbackStore, FeedbackUnavailable, live_ece
from service.observability.drift import DriftMonitor
from tests.service.conftest import Running, metric_value, random_pixels, serve, settings_for, wait_for


def predict(server: Running, n: int, seed: int, n_samples: int = 4) -> dict:
    body = {"inputs": [{"pixels": p} for p in random_pixels(np.random.default_rng(seed), n)], "n_samples": n_samples}
    response = httpx.post(f"{server.url}/predict", json=body, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


def test_feedback_moves_live_accuracy_and_survives_a_restart(tiny_repository: Path, tmp_path: Path) -> None:
    settings = settings_for(tiny_repository, tmp_path)
    with serve(settings) as server:
        out = predict(server, 2, seed=10)
        first, second = out["predictions"]
        right = httpx.post(f"{server.url}/feedback", json={"id": out["id"], "index": 0, "label": first["label"]})
        assert right.status_code == 200, right.text
        assert right.json()["correct"] is True and right.json()["live_accuracy"] == 1.0
        wrong_index = (second["class_index"] + 1) % 10
        wrong = httpx.post(f"{server.url}/feedback", json={"id": out["id"], "index": 1, "label": wrong_index}).json()
        assert wrong["correct"] is False and wrong["live_accuracy"] == 0.5 and wrong["labelled"] == 2
        text = httpx.get(f"{server.url}/metrics").text
        assert metric_value(text, "director_live_accuracy_ratio", model="tiny", version="1") == 0.5
        assert metric_value(text, "director_feedback_total", model="tiny", version="1") == 2.0
        ece = metric_value(text, "director_live_ece_ratio", model="tiny", version="1")
        assert ece is not None and 0.0 <= ece <= 1.0
        missing = httpx.post(f"{server.url}/feedback", json={"id": "0" * 32, "index": 0, "label": 1})
        assert missing.status_code == 404
        bad_label = httpx.post(f"{server.url}/feedback", json={"id": out["id"], "index": 0, "label": "Spaceship"})
        assert bad_label.status_code == 422
        bad_index = httpx.post(f"{server.url}/feedback", json={"id": out["id"], "index": 0, "label": 10})
        assert bad_index.status_code == 422
    with serve(settings) as restarted:
        text = httpx.get(f"{restarted.url}/metrics").text
        assert metric_value(text, "director_live_accuracy_ratio", model="tiny", version="1") == 0.5
        again = httpx.post(f"{restarted.url}/feedback", json={"id": out["id"], "index": 1, "label":
                                                              second["label"]}).json()
        assert again["live_accuracy"] == 1.0


def test_feedback_can_name_the_request_id_a_prediction_was_made_under(tiny_repository: Path, tmp_path: Path
                                                                     ) -> None:
    with serve(settings_for(tiny_repository, tmp_path)) as server:
        body = {"inputs": [{"pixels": random_pixels(np.random.default_rng(9), 1)[0]}]}
        tagged = httpx.post(f"{server.url}/predict", headers={"X-Request-ID": "order-42"}, json=body).json()
        by_request = httpx.post(f"{server.url}/feedback", json={"request_id": "order-42", "index": 0, "label": 0})
        assert by_request.status_code == 200 and by_request.json()["id"] == tagged["id"]
        both = {"id": tagged["id"], "request_id": "order-42", "index": 0, "label": 0}
        for refused in (both, {"index": 0, "label": 0}):
            assert httpx.post(f"{server.url}/feedback", json=refused).status_code == 422, refused
        unknown = httpx.post(f"{server.url}/feedback", json={"request_id": "order-43", "index": 0, "label": 0})
        assert unknown.status_code == 404 and "order-43" in unknown.json()["error"]


@pytest.fixture(params=["sqlite", "postgres"])
def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[..., FeedbackStore]:
    """Opens a store of each backend on one file or database, however often it is called."""
    if request.param == "sqlite":
        return lambda **bounds: SqliteFeedbackStore(tmp_path / "f.sqlite3", **bounds)
    url = request.getfixturevalue("postgres_cluster").create_database(f"bounds_{tmp_path.name.lower()}")
    return lambda **bounds: PostgresFeedbackStore(url, **bounds)


def test_feedback_store_is_bounded_in_rows_and_age(open_store: Callable[..., FeedbackStore]) -> None:
    store = open_store(max_rows=5, max_age_s=3600, window=3)
    for i in range(12):
        store.log(f"r{i}", "m", "1", 4, [(0, "a", 0.9)])
    store.prune()
    assert store.count() == 5
    assert store.lookup("r11", 0) is not None and store.lookup("r0", 0) is None
    for i, correct in zip(range(7, 12), [True, True, False, False, True], strict=True):
        store.record(f"r{i}", 0, correct)
    stats = store.live_stats("m", "1")  # the window: the 3 latest labels
    assert stats is not None and stats.n == 3 and stats.accuracy == pytest.approx(1 / 3)
    assert store.labelled_versions() == [("m", "1")] and store.live_stats("m", "2") is None
    store.close()
    aged = open_store(max_rows=5, max_age_s=1e-9, window=100)
    assert aged.count() == 0  # everything is older than the age limit
    aged.close()


def test_the_clients_request_id_names_its_newest_prediction(open_store: Callable[..., FeedbackStore]) -> None:
    """Both backends: a prediction is found by the X-Request-ID it was made under (the newest, when a client
    reused one), and predictions logged without one are found by their own id only."""
    store = open_store(max_rows=100, max_age_s=3600, window=100)
    store.log("p1", "m", "1", 4, [(0, "a", 0.9)], client_request_id="client-7")
    store.log("p2", "m", "1", 4, [(1, "b", 0.8)], client_request_id="client-7")  # a retry under the same id
    store.log("p3", "m", "1", 4, [(1, "b", 0.8)])
    assert store.prediction_of("client-7") == "p2"
    assert store.prediction_of("client-8") is None and store.lookup("p3", 0) is not None
    store.close()


def test_a_database_from_before_the_request_id_column_is_migrated(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    with sqlite3.connect(path) as old:  # the schema as it was, with one logged prediction
        old.execute("CREATE TABLE predictions (request_id TEXT NOT NULL, idx INTEGER NOT NULL, model TEXT NOT NULL, "
                    "version TEXT NOT NULL, n_samples INTEGER NOT NULL, class_index INTEGER NOT NULL, label TEXT NOT "
                    "NULL, confidence REAL NOT NULL, created REAL NOT NULL, correct INTEGER, feedback_at REAL, "
                    "PRIMARY KEY (request_id, idx))")
        old.execute("INSERT INTO predictions VALUES ('old', 0, 'm', '1', 4, 0, 'a', 0.9, ?, NULL, NULL)",
                    (time.time(),))
    store = SqliteFeedbackStore(path, max_rows=100, max_age_s=3600, window=100)
    assert store.lookup("old", 0) is not None and store.prediction_of("anything") is None
    store.log("new", "m", "1", 4, [(0, "a", 0.9)], client_request_id="c1")
    assert store.prediction_of("c1") == "new"
    store.close()


def on_database(store: FeedbackStore, sql: str) -> list[tuple]:
    """Run ``sql`` on the store's own database, what is logged written first."""
    store.flush()
    if isinstance(store, SqliteFeedbackStore):
        with store._database():  # the connection's lock: a server's flusher thread shares it
            return store._conn.execute(sql).fetchall()
    assert isinstance(store, PostgresFeedbackStore)
    with store._connection() as conn:
        cursor = conn.execute(sql)  # type: ignore[arg-type]
        return cursor.fetchall() if cursor.description else []


def stored_id_characters(store: FeedbackStore) -> int:
    """Characters of clients' request ids the store holds, in either place one may sit."""
    return int(on_database(store, "SELECT (SELECT COALESCE(SUM(LENGTH(client_request_id)), 0) FROM predictions) + "
                                  "(SELECT COALESCE(SUM(LENGTH(client_request_id)), 0) FROM client_requests)")[0][0])


def test_a_requests_client_id_is_stored_once_not_once_per_row(open_store: Callable[..., FeedbackStore]) -> None:
    """Both backends: a 128-character id on a 256-input request is stored once (it was stored with every row: one gRPC
    call with a 1 MiB id and 256 texts grew the store by 499 MB); the id goes when its request's rows are pruned."""
    store = open_store(max_rows=256, max_age_s=3600, window=100)
    store.log("p1", "m", "1", 4, [(0, "a", 0.9)] * 256, client_request_id="x" * 128)
    assert stored_id_characters(store) == 128 and store.prediction_of("x" * 128) == "p1"
    store.log("p2", "m", "1", 4, [(1, "b", 0.8)] * 256)  # the newest max_rows rows: every row of p1 is pruned
    store.prune()
    assert store.lookup("p1", 0) is None and store.lookup("p2", 255) is not None
    assert stored_id_characters(store) == 0 and store.prediction_of("x" * 128) is None
    store.close()


def test_ids_stored_with_every_row_by_an_earlier_release_stay_readable(open_store: Callable[..., FeedbackStore]
                                                                       ) -> None:
    """Rows written when the id was a column of each row (an older database, or a replica of the earlier release
    sharing PostgreSQL during an upgrade) are still found by their id, and a newer prediction under it wins."""
    store = open_store(max_rows=100, max_age_s=3600, window=100)
    on_database(store, "INSERT INTO predictions (request_id, idx, model, version, n_samples, class_index, label, "
                       f"confidence, created, client_request_id) VALUES ('old', 0, 'm', '1', 4, 0, 'a', 0.9, "
                       f"{time.time() - 1}, 'order-1')")
    assert store.prediction_of("order-1") == "old"
    store.log("new", "m", "1", 4, [(0, "a", 0.9)], client_request_id="order-1")  # a retry, logged as now
    assert store.prediction_of("order-1") == "new"
    store.close()


def test_a_long_client_id_grows_the_sqlite_file_by_one_id_at_most(tmp_path: Path) -> None:
    """The file's growth for 256 rows under a 128-character id is that of the same rows without one, plus at most a
    page for the id (it was 256 copies in the table and 256 in its index: 16 pages more)."""

    def growth(name: str, client_id: str | None) -> int:
        store = SqliteFeedbackStore(tmp_path / name, max_rows=1000, max_age_s=3600, window=100)
        page = store._conn.execute("PRAGMA page_size").fetchone()[0]
        before = on_database(store, "PRAGMA page_count")[0][0] * page
        store.log("p" * 32, "m", "1", 4, [(3, "Dress", 0.75)] * 256, client_request_id=client_id)
        after = on_database(store, "PRAGMA page_count")[0][0] * page
        store.close()
        return after - before

    plain, named = growth("plain.sqlite3", None), growth("named.sqlite3", "x" * 128)
    assert plain > 0 and named - plain <= 4096, (plain, named)


def test_feedback_log_is_buffered_then_written_in_one_transaction_and_read_through(tmp_path: Path) -> None:
    """``log`` does no I/O (it runs on the event loop); a read sees what was logged; ``close`` writes the rest."""
    path = tmp_path / "f.sqlite3"
    store = SqliteFeedbackStore(path, max_rows=100, max_age_s=3600, window=100)
    store.log("a", "m", "1", 4, [(0, "x", 0.9), (1, "y", 0.6)])
    assert store.pending == 2
    with sqlite3.connect(path) as other:  # nothing written yet
        assert other.execute("SELECT COUNT(*) FROM predictions").fetchone()[0] == 0
    assert store.lookup("a", 1) is not None and store.pending == 0  # a read flushes first
    store.log("b", "m", "1", 4, [(0, "x", 0.8)])
    assert store.flush() == 1 and store.flush() == 0
    store.log("c", "m", "1", 4, [(1, "y", 0.7)])
    store.close()
    reopened = SqliteFeedbackStore(path, max_rows=100, max_age_s=3600, window=100)
    assert reopened.count() == 4 and reopened.lookup("c", 0) is not None
    reopened.close()


def test_a_failed_flush_keeps_its_rows_for_the_next(tmp_path: Path) -> None:
    store = SqliteFeedbackStore(tmp_path / "f.sqlite3", max_rows=100, max_age_s=3600, window=100)
    store.log("a", "m", "1", 4, [(0, "x", 0.9)])
    store.log("b", "m", "1", 4, [(0, "x", object())])  # type: ignore[list-item]  # not a number: the insert fails
    with pytest.raises(FeedbackUnavailable, match="InterfaceError|ProgrammingError"):  # a store error, never a 500
        store.flush()
    assert store.pending == 2  # rolled back, and both rows still queued
    store._pending.pop()  # drop the bad row by hand; the good one is still queued, in order
    assert store.flush() == 1 and store.lookup("a", 0) is not None
    store.close()


def test_a_read_only_database_fails_as_the_store_and_recovers(tmp_path: Path) -> None:
    """SQLite's own read-only error (staged with ``PRAGMA query_only``: root ignores file modes) is FeedbackUnavailable
    for the log's flush and for a label, never a 500; the rows wait and are written once writes return."""
    store = SqliteFeedbackStore(tmp_path / "f.sqlite3", max_rows=100, max_age_s=3600, window=100)
    store.log("a", "m", "1", 4, [(0, "x", 0.9)])
    assert store.flush() == 1
    store._conn.execute("PRAGMA query_only = ON")
    store.log("b", "m", "1", 4, [(0, "x", 0.8)])
    with pytest.raises(FeedbackUnavailable, match="readonly"):
        store.flush()
    with pytest.raises(FeedbackUnavailable, match="readonly"):
        store.record("a", 0, True)
    assert store.pending == 1  # the row waits for the next flush
    store._conn.execute("PRAGMA query_only = OFF")
    assert store.flush() == 1 and store.lookup("b", 0) is not None
    store.close()


def test_the_log_is_written_in_bounded_transactions_and_what_overflows_is_counted(tmp_path: Path) -> None:
    """A flush writes at most FLUSH_CHUNK rows per transaction (a store short of space takes a small one once space
    returns), keeps what a failed chunk did not write, and counts every row dropped past max_rows."""
    store = SqliteFeedbackStore(tmp_path / "f.sqlite3", max_rows=FLUSH_CHUNK * 3, max_age_s=3600, window=100)
    drops: list[int] = []
    store.on_drop = drops.append
    calls: list[int] = []
    insert = store._insert

    def failing_third(rows: list, label_sets: list) -> None:  # the third transaction fails once: the disk is full
        calls.append(len(rows))
        if len(calls) == 3:
            raise FeedbackUnavailable("disk full")
        insert(rows, label_sets)

    store._insert = failing_third  # type: ignore[method-assign]
    store.log("a", "m", "1", 1, [(0, "x", 0.5)] * (FLUSH_CHUNK * 2 + 10))
    with pytest.raises(FeedbackUnavailable):
        store.flush()
    assert calls == [FLUSH_CHUNK, FLUSH_CHUNK, 10] and store.pending == 10  # what was written stays written
    store.log("b", "m", "1", 1, [(0, "x", 0.5)] * (FLUSH_CHUNK * 3))  # past max_rows waiting: the oldest go
    assert store.pending == FLUSH_CHUNK * 3 and drops == [10] and store.dropped == 10
    assert store.flush() == FLUSH_CHUNK * 3 and store.pending == 0
    store.close()


def test_a_locked_store_slows_only_feedback(tiny_repository: Path, tmp_path: Path) -> None:
    """Another process holds the SQLite file locked: /feedback answers 503 with Retry-After within the store's
    timeout, /metrics answers at once with the last live values, and /predict runs at its usual pace."""
    settings = settings_for(tiny_repository, tmp_path, feedback_timeout_s=0.5, feedback_threads=1)
    with serve(settings) as server:
        body = {"inputs": [{"pixels": random_pixels(np.random.default_rng(0))[0]}], "n_samples": 2}
        first = httpx.post(f"{server.url}/predict", json=body, timeout=60)
        assert first.status_code == 200
        with sqlite3.connect(tmp_path / "feedback.sqlite3", timeout=1) as locker:
            locker.execute("BEGIN EXCLUSIVE")  # writers and readers wait on it
            try:
                with httpx.Client(base_url=server.url, timeout=30) as client:
                    start = time.monotonic()
                    refused = [client.post("/feedback", json={"id": first.json()["id"], "index": 0, "label": 1})
                               for _ in range(3)]
                    assert all(r.status_code == 503 and "Retry-After" in r.headers for r in refused)
                    assert time.monotonic() - start < 10
                    start = time.monotonic()
                    assert client.get("/metrics").status_code == 200
                    assert time.monotonic() - start < 5
                    for _ in range(10):
                        assert client.post("/predict", json=body).status_code == 200
            finally:
                locker.rollback()
        # the store is back: so is /feedback, once the calls that queued behind the lock have drained
        answers: list[httpx.Response] = []
        wait_for(lambda: answers.append(httpx.post(f"{server.url}/feedback", timeout=30, json={
            "id": first.json()["id"], "index": 0, "label": 1})) or answers[-1].status_code != 503,
            "/feedback to answer again", timeout_s=10, poll_s=0.1)
        assert answers[-1].status_code == 200, answers[-1].text


def test_ece_of_perfectly_calibrated_and_overconfident_rows() -> None:
    assert live_ece([(0.75, 1), (0.75, 1), (0.75, 1), (0.75, 0)]) == pytest.approx(0.0)
    assert live_ece([(0.95, 0), (0.95, 0)]) == pytest.approx(0.95)


def test_drift_monitor_waits_for_its_window_and_separates_shifts() -> None:
    rng = np.random.default_rng(0)
    reference_sample = rng.beta(8, 2, 20000)
    levels = np.linspace(0, 1, 101)
    reference = {"quantile_levels": levels.tolist(), "confidence_quantiles": np.quantile(reference_sample,
                                                                                         levels).tolist(),
                 "confidence_deciles": np.quantile(reference_sample, np.linspace(0.1, 0.9, 9)).tolist()}
    same = DriftMonitor(reference, window=500, min_window=100)
    assert same.observe(rng.beta(8, 2, 99).tolist()) is None
    calm = same.observe(rng.beta(8, 2, 401).tolist())
    assert calm is not None and calm.window == 500 and calm.ks < 0.08 and calm.psi < 0.05
    shifted = DriftMonitor(reference, window=500, min_window=100).observe(rng.beta(2, 2, 500).tolist())
    assert shifted is not None and shifted.ks > 0.4 and shifted.psi > 0.5


def test_metrics_cover_predictions_ood_and_drift(tiny_server: Running) -> None:
    before = httpx.get(f"{tiny_server.url}/metrics").text
    predicted_before = metric_value(before, "director_predictions_total", model="tiny", version="1") or 0.0
    ood_before = metric_value(before, "director_ood_predictions_total", model="tiny", version="1") or 0.0
    flagged = 0
    for seed in range(3):  # 24 inputs at the default sample count: more than drift_min_window (20)
        out = predict(tiny_server, 8, seed=100 + seed)
        flagged += sum(p["is_ood"] for p in out["predictions"])
    text = httpx.get(f"{tiny_server.url}/metrics").text
    assert metric_value(text, "director_predictions_total", model="tiny", version="1") == predicted_before + 24
    assert metric_value(text, "director_ood_predictions_total", model="tiny", version="1") == ood_before + flagged
    ks = metric_value(text, "director_confidence_drift_ks", model="tiny", version="1")
    psi = metric_value(text, "director_confidence_drift_psi", model="tiny", version="1")
    assert ks is not None and 0.0 <= ks <= 1.0 and psi is not None and psi >= 0.0
    for name in ("director_request_duration_seconds_count", "director_queue_wait_seconds_count",
                 "director_inference_duration_seconds_count", "director_batch_samples_count",
                 "director_prediction_confidence_count", "director_predictive_entropy_nats_count",
                 "director_mutual_information_nats_count", "director_ood_score_count"):
        assert name in text, name
    assert 'director_model_info{method="director",model="tiny",state="ready",version="1"} 1.0' in text
    assert metric_value(text, "director_queue_depth", model="tiny", version="1") == 0.0


def test_drift_is_not_reported_before_the_minimum_window(tiny_repository: Path, tmp_path: Path) -> None:
    with serve(settings_for(tiny_repository, tmp_path, drift_min_window=50)) as server:
        predict(server, 8, seed=1)
        predict(server, 8, seed=2, n_samples=2)  # not the default sample count: not in the drift window
        text = httpx.get(f"{server.url}/metrics").text
        assert metric_value(text, "director_confidence_drift_ks", model="tiny", version="1") is None
        assert metric_value(text, "director_predictions_total", model="tiny", version="1") == 16.0
