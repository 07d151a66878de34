"""The prediction log's sets and abstentions (service/feedback/decisions.py) on both backends: live coverage and
selective risk per level over the same window as live accuracy, at most MAX_LEVELS levels per version, compact rows,
databases of the previous schema still readable, and gauges of levels no longer reported removed."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from service.feedback.decisions import MAX_LEVELS, DecisionLog, LiveDecisions, LiveRate, in_set, set_mask
from service.feedback.postgres import PostgresFeedbackStore
from service.feedback.sqlite import SqliteFeedbackStore
from service.feedback.store import FeedbackStore, LabelSet
from service.observability.metrics import Metrics
from tests.service.conftest import metric_value
from tests.service.pg_cluster import PostgresCluster

# the predictions table as the previous release wrote it: no decision columns
OLD_COLUMNS = ("request_id TEXT NOT NULL, idx {int} NOT NULL, model TEXT NOT NULL, version TEXT NOT NULL, n_samples "
               "INTEGER NOT NULL, class_index INTEGER NOT NULL, label TEXT NOT NULL, confidence {real} NOT NULL, "
               "created {real} NOT NULL, correct INTEGER, feedback_at {real}, client_request_id TEXT, "
               "PRIMARY KEY (request_id, idx)")
OLD_ROW = "INSERT INTO predictions VALUES ('old', 0, 'm', '1', 4, 0, 'a', 0.9, {now}, 1, {now}, NULL)"


@pytest.fixture(params=["sqlite", "postgres"])
def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[..., FeedbackStore]:
    """Opens a store of each backend on one file or database, however often it is called."""
    if request.param == "sqlite":
        return lambda **bounds: SqliteFeedbackStore(tmp_path / "f.sqlite3", **bounds)
    url = request.getfixturevalue("postgres_cluster").create_database(f"decided_{tmp_path.name.lower()}")
    return lambda **bounds: PostgresFeedbackStore(url, **bounds)


def one_client(value: float, n: int) -> LiveRate:
    """A level's rate when one client (here: none named) sent every label: it is the majority, so the robust reading
    is the whole window."""
    return LiveRate(value, n, clients=1, robust_value=value, robust_n=n)


def test_a_set_is_stored_in_at_most_one_bit_per_label() -> None:
    assert set_mask([]) == b"" and set_mask([0]) == b"\x01" and set_mask([9, 1]) == b"\x02\x02"
    mask = set_mask(range(0, 1000, 7))
    assert len(mask) <= 125 and [i for i in range(1000) if in_set(mask, i)] == list(range(0, 1000, 7))
    assert not in_set(b"", 0) and not in_set(b"\x01", 8) and not in_set(b"\x01", -1)


def test_coverage_and_risk_per_level_over_the_latest_window(open_store: Callable[..., FeedbackStore]) -> None:
    """Per level, the latest ``window`` labels, as live accuracy reads them; selective risk counts answered rows
    only, and a level whose rows are all unlabelled or abstained is not reported."""
    store = open_store(max_rows=100, max_age_s=3600, window=3)
    sets = [set_mask([0]), set_mask([0, 1]), set_mask([2])] * 2
    store.log("a", "m", "1", 4, [(0, "a", 0.9)] * 6, decisions=DecisionLog(0.9, sets, 0.1, [False] * 5 + [True]))
    store.log("b", "m", "1", 4, [(1, "b", 0.6)] * 2, decisions=DecisionLog(0.8, sets[:2], 0.2, [True, True]))
    store.log("c", "m", "1", 4, [(1, "b", 0.6)])  # asked for neither
    for index, (correct, covered) in enumerate([(True, True), (False, False), (False, True), (True, True),
                                                (False, False), (False, True)]):
        store.record("a", index, correct, covered)
    store.record("b", 0, True, True)
    store.record("c", 0, True)
    live = store.live_decisions("m", "1")
    assert live.coverage == {0.9: one_client(2 / 3, 3), 0.8: one_client(1.0, 1)}  # rows 3-5 of a, row 0 of b
    assert live.selective_risk == {0.1: one_client(2 / 3, 3)}  # rows 2-4: row 5 abstained; b abstained on all
    stats = store.live_stats("m", "1")
    assert stats is not None and stats.n == 3  # the same window
    assert store.live_decisions("m", "2").coverage == {}
    store.close()


def test_multi_label_sets_count_their_recall(open_store: Callable[..., FeedbackStore]) -> None:
    """A multi-label set's row stores the share of the true labels it held; live coverage at its level is their mean,
    beside a single-label version's covered share, and survives a reopened store."""
    store = open_store(max_rows=100, max_age_s=3600, window=10)
    store.log("t", "tags", "1", 1, [(0, '["a"]', 0.7)] * 3,
              decisions=DecisionLog(0.9, [set_mask([0]), set_mask([0, 1]), set_mask([])], None, None))
    for index, recall in enumerate([0.5, 1.0, 0.0]):
        store.record("t", index, recall == 1.0, None, recall)
    assert store.live_decisions("tags", "1").coverage == {0.9: one_client(0.5, 3)}
    store.close()
    reopened = open_store(max_rows=100, max_age_s=3600, window=10)
    assert reopened.live_decisions("tags", "1").coverage == {0.9: one_client(0.5, 3)}
    reopened.close()


def test_at_most_max_levels_per_version_the_most_labelled(open_store: Callable[..., FeedbackStore]) -> None:
    """A client cycling through levels cannot grow the series: the MAX_LEVELS levels with the most labels are kept
    (ties: the smaller level), whatever else was asked."""
    store = open_store(max_rows=1000, max_age_s=3600, window=100)
    levels = [round(0.5 + 0.02 * i, 2) for i in range(MAX_LEVELS + 2)]
    for n, level in enumerate(levels):
        rows = 1 if n < 3 else 2  # the first three levels have one label each, the others two
        store.log(f"r{n}", "m", "1", 4, [(0, "a", 0.9)] * rows,
                  decisions=DecisionLog(level, [set_mask([0])] * rows, None, None))
        for index in range(rows):
            store.record(f"r{n}", index, True, True)
    coverage = store.live_decisions("m", "1").coverage
    assert len(coverage) == MAX_LEVELS and set(coverage) == {levels[0], *levels[3:]}
    store.close()


def test_a_database_of_the_previous_schema_opens_and_gains_the_columns(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    now = time.time()
    with sqlite3.connect(path) as old:
        old.execute(f"CREATE TABLE predictions ({OLD_COLUMNS.format(int='INTEGER', real='REAL')})")
        old.execute(OLD_ROW.format(now=now))
    store = SqliteFeedbackStore(path, max_rows=100, max_age_s=3600, window=100)
    check_old_rows_and_new_ones(store)
    store.close()
    reopened = SqliteFeedbackStore(path, max_rows=100, max_age_s=3600, window=100)  # migrated once, opens again
    assert reopened.live_decisions("m", "1").coverage == {0.9: one_client(0.0, 1)}
    reopened.close()


def test_a_postgres_database_of_the_previous_schema_opens(postgres_cluster: PostgresCluster) -> None:
    import psycopg

    url = postgres_cluster.create_database("previous_schema")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE predictions ({OLD_COLUMNS.format(int='BIGINT', real='DOUBLE PRECISION')})")
        conn.execute(OLD_ROW.format(now=time.time()))
    store = PostgresFeedbackStore(url, max_rows=100, max_age_s=3600, window=100)
    check_old_rows_and_new_ones(store)
    store.close()


def check_old_rows_and_new_ones(store: FeedbackStore) -> None:
    """A row of the previous schema is found and counts for accuracy, not for coverage; new rows log their sets."""
    old = store.lookup("old", 0)
    assert old is not None and old.prediction_set is None
    stats = store.live_stats("m", "1")
    assert stats is not None and stats.n == 1 and store.live_decisions("m", "1").coverage == {}
    store.log("new", "m", "1", 4, [(0, "a", 0.9)], decisions=DecisionLog(0.9, [set_mask([0, 3])], None, None))
    new = store.lookup("new", 0)
    assert new is not None and new.prediction_set == set_mask([0, 3])
    store.record("new", 0, False, False)
    assert store.live_decisions("m", "1").coverage == {0.9: one_client(0.0, 1)}


def test_decisions_grow_the_sqlite_file_by_their_bounded_row_size(tmp_path: Path) -> None:
    """256 inputs of a 1000-class model, each with a set of every label (the largest a set can be): the file grows by
    at most 125 bytes of bitmask and 40 of columns and record overhead per row over the same rows without them."""

    def growth(name: str, decisions: DecisionLog | None) -> int:
        store = SqliteFeedbackStore(tmp_path / name, max_rows=1000, max_age_s=3600, window=100)
        page = store._conn.execute("PRAGMA page_size").fetchone()[0]
        store.flush()
        before = store._conn.execute("PRAGMA page_count").fetchone()[0] * page
        store.log("p" * 32, "m", "1", 4, [(3, "Dress", 0.75)] * 256, decisions=decisions)
        store.flush()
        after = store._conn.execute("PRAGMA page_count").fetchone()[0] * page
        store.close()
        return after - before

    full = DecisionLog(0.95, [set_mask(range(1000))] * 256, 0.05, [False] * 256)
    plain, decided = growth("plain.sqlite3", None), growth("decided.sqlite3", full)
    assert len(set_mask(range(1000))) == 125
    assert 256 * 125 <= decided - plain <= 256 * (125 + 40) + 2 * 4096, (plain, decided)


def test_gauges_of_levels_no_longer_reported_are_removed() -> None:
    metrics = Metrics()
    metrics.live.set_decisions("m", "1", LiveDecisions({0.9: one_client(0.875, 8), 0.8: one_client(0.75, 4)},
                                                      {0.05: one_client(0.02, 50)}).by_kind())
    text = metrics.expose().decode()
    assert metric_value(text, "director_live_coverage_ratio", model="m", version="1", coverage="0.9") == 0.875
    assert metric_value(text, "director_live_coverage_count", model="m", version="1", coverage="0.8") == 4.0
    assert metric_value(text, "director_live_coverage_target_ratio", model="m", version="1", coverage="0.8") == 0.8
    assert metric_value(text, "director_live_selective_risk_ratio", model="m", version="1", max_risk="0.05") == 0.02
    assert metric_value(text, "director_live_selective_risk_bound_ratio", model="m", version="1",
                        max_risk="0.05") == 0.05
    metrics.live.set_decisions("m", "1", LiveDecisions({0.9: one_client(0.9, 10)}, {}).by_kind())
    text = metrics.expose().decode()
    assert metric_value(text, "director_live_coverage_ratio", model="m", version="1", coverage="0.9") == 0.9
    for name in ("director_live_coverage_ratio", "director_live_coverage_count", "director_live_coverage_target_ratio",
                 "director_live_coverage_robust_ratio", "director_live_coverage_clients"):
        assert metric_value(text, name, model="m", version="1", coverage="0.8") is None, name
    assert "director_live_selective_risk_ratio{" not in text


def test_unlabelled_predictions_are_pruned_before_labelled_ones(open_store: Callable[..., FeedbackStore]) -> None:
    """Prediction volume cannot erase the live windows: 200 labelled rows survive 22 requests of 256 unlabelled inputs
    at max_rows 5000, and feedback on them still finds them; the gauges' window stays whole."""
    store = open_store(max_rows=5000, max_age_s=3600, window=1000)
    store.log("labelled", "m", "1", 4, [(0, "a", 0.9)] * 200,
              decisions=DecisionLog(0.9, [set_mask([0])] * 200, None, None))
    for index in range(200):
        store.record("labelled", index, True, True, client="key:labeller")
    for n in range(22):
        store.log(f"u{n}", "m", "1", 4, [(0, "a", 0.9)] * 256)
        store.flush()
    store.prune()
    assert store.count() <= 5000 and store.lookup("labelled", 199) is not None
    stats = store.live_stats("m", "1")
    assert stats is not None and stats.n == 200 and store.live_decisions("m", "1").coverage[0.9].n == 200
    assert store.lookup("u21", 255) is not None and store.lookup("u0", 0) is None  # the oldest unlabelled went
    store.close()


def test_labelled_rows_beyond_their_share_are_pruned_oldest_first(open_store: Callable[..., FeedbackStore]) -> None:
    """Labelled rows are kept up to max_rows * LABELLED_SHARE: beyond that the oldest go too, so new predictions
    always have room to be labelled."""
    store = open_store(max_rows=100, max_age_s=3600, window=1000)
    for n in range(3):
        store.log(f"l{n}", "m", "1", 4, [(0, "a", 0.9)] * 40)
        for index in range(40):
            store.record(f"l{n}", index, True)
    store.log("new", "m", "1", 4, [(0, "a", 0.9)] * 40)
    store.prune()
    assert store.count() == 100 and store.lookup("new", 39) is not None
    stats = store.live_stats("m", "1")
    assert stats is not None and 50 <= stats.n < 120  # 120 labelled rows could not all stay
    store.close()


def test_a_level_counts_its_clients_and_reads_without_a_minority_client(
        open_store: Callable[..., FeedbackStore]) -> None:
    """42 wrong labels from one client among 958 right ones from another: the level reads 0.958 with both, 1.0
    robustly (without the minority client); the majority cannot be left out, so a few right labels from a second
    client cannot hide 100 wrong ones; one client alone is its whole window."""
    store = open_store(max_rows=2000, max_age_s=3600, window=1000)
    store.log("r", "m", "1", 4, [(0, "a", 0.9)] * 1000, decisions=DecisionLog(0.9, [set_mask([0])] * 1000, None, None))
    for index in range(1000):
        store.record("r", index, index >= 42, index >= 42, client="key:attacker" if index < 42 else "key:labeller")
    rate = store.live_decisions("m", "1").coverage[0.9]
    assert (rate.n, rate.clients, rate.robust_n) == (1000, 2, 958)
    assert rate.value == pytest.approx(0.958) and rate.robust_value == 1.0
    stats = store.live_stats("m", "1")
    assert stats is not None and stats.clients == 2
    store.log("s", "m", "1", 4, [(0, "a", 0.9)] * 100, decisions=DecisionLog(0.8, [set_mask([0])] * 100, None, None))
    for index in range(100):
        store.record("s", index, False, False, client="key:attacker")
    alone = store.live_decisions("m", "1").coverage[0.8]
    assert (alone.value, alone.n, alone.clients, alone.robust_value, alone.robust_n) == (0.0, 100, 1, 0.0, 100)
    store.log("t", "m", "1", 4, [(0, "a", 0.9)] * 3, decisions=DecisionLog(0.8, [set_mask([0])] * 3, None, None))
    for index in range(3):
        store.record("t", index, True, True, client="key:silencer")
    diluted = store.live_decisions("m", "1").coverage[0.8]
    assert (diluted.clients, diluted.robust_n) == (2, 103) and diluted.robust_value == pytest.approx(3 / 103)
    store.close()


def test_a_level_short_of_its_promise_is_never_pushed_out(open_store: Callable[..., FeedbackStore]) -> None:
    """A level exported while short of its promise stays exported when more than MAX_LEVELS others gain more labels;
    a level meeting its promise gives way to the most labelled."""
    store = open_store(max_rows=5000, max_age_s=3600, window=1000)
    store.log("short", "m", "1", 4, [(0, "a", 0.9)] * 10, decisions=DecisionLog(0.9, [set_mask([0])] * 10, None, None))
    store.log("fine", "m", "1", 4, [(0, "a", 0.9)] * 10, decisions=DecisionLog(0.5, [set_mask([0])] * 10, None, None))
    for index in range(10):
        store.record("short", index, False, False)
        store.record("fine", index, True, True)
    before = store.live_decisions("m", "1")
    assert set(before.coverage) == {0.9, 0.5}
    for n in range(MAX_LEVELS):
        level = round(0.6 + 0.01 * n, 2)
        store.log(f"new{n}", "m", "1", 4, [(0, "a", 0.9)] * 20,
                  decisions=DecisionLog(level, [set_mask([0])] * 20, None, None))
        for index in range(20):
            store.record(f"new{n}", index, True, True)
    after = store.live_decisions("m", "1", before)
    assert len(after.coverage) == MAX_LEVELS and 0.9 in after.coverage and 0.5 not in after.coverage
    assert 0.9 not in store.live_decisions("m", "1").coverage  # without what was exported: the most labelled
    store.close()


def test_a_logged_prediction_keeps_its_versions_labels(open_store: Callable[..., FeedbackStore]) -> None:
    """Feedback is checked against the labels a prediction was logged with, whether or not its version is loaded:
    the store keeps each version's label set once, and a reopened store still has it."""
    store = open_store(max_rows=100, max_age_s=3600, window=10)
    store.log("a", "m", "1", 4, [(1, "b", 0.9)], label_set=LabelSet(("a", "b"), multi_label=False))
    store.log("t", "tags", "2", 1, [(0, '["x"]', 0.7)], label_set=LabelSet(("x", "y", "z"), multi_label=True))
    store.log("old", "m", "0", 4, [(0, "a", 0.9)])
    store.close()
    reopened = open_store(max_rows=100, max_age_s=3600, window=10)
    single, tagged, old = reopened.lookup("a", 0), reopened.lookup("t", 0), reopened.lookup("old", 0)
    assert single is not None and single.label_set == LabelSet(("a", "b"), multi_label=False)
    assert tagged is not None and tagged.label_set == LabelSet(("x", "y", "z"), multi_label=True)
    assert old is not None and old.label_set is None
    reopened.close()
