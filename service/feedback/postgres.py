"""The shared feedback store: PostgreSQL through a psycopg 3 connection pool, so that every replica logs into, and
computes live accuracy, ECE, coverage and selective risk from, the same rows.

The pool opens in the background and the schema is created on the first connection that works: a server whose
database is away still starts and serves predictions; every store call raises ``FeedbackUnavailable`` until the
database answers again (``/feedback`` turns that into a 503)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg_pool import ConnectionPool

from service.feedback.decisions import levels_sql, window_sql
from service.feedback.store import (
    LABEL_SETS_SCHEMA,
    FeedbackStore,
    FeedbackUnavailable,
    LoggedPrediction,
    Row,
    client_ids,
    label_set_of,
    prediction_rows,
)

SCHEMA = """
CREATE TABLE IF NOT EXISTS predictions (
    request_id TEXT NOT NULL,
    idx BIGINT NOT NULL,
    model TEXT NOT NULL,
    version TEXT NOT NULL,
    n_samples INTEGER NOT NULL,
    class_index INTEGER NOT NULL,
    label TEXT NOT NULL,
    confidence DOUBLE PRECISION NOT NULL,
    created DOUBLE PRECISION NOT NULL,
    correct INTEGER,
    feedback_at DOUBLE PRECISION,
    client_request_id TEXT,
    coverage DOUBLE PRECISION,
    prediction_set BYTEA,
    max_risk DOUBLE PRECISION,
    abstain INTEGER,
    covered INTEGER,
    recall DOUBLE PRECISION,
    feedback_client TEXT,
    PRIMARY KEY (request_id, idx)
);
ALTER TABLE predictions ADD COLUMN IF NOT EXISTS client_request_id TEXT;
ALTER TABLE predictions ADD COLUMN IF NOT EXISTS coverage DOUBLE PRECISION;
ALTER TABLE predictions ADD COLUMN IF NOT EXISTS prediction_set BYTEA;
ALTER TABLE predictions ADD COLUMN IF NOT EXISTS max_risk DOUBLE PRECISION;
ALTER TABLE predictions ADD COLUMN IF NOT EXISTS abstain INTEGER;
ALTER TABLE predictions ADD COLUMN IF NOT EXISTS covered INTEGER;
ALTER TABLE predictions ADD COLUMN IF NOT EXISTS recall DOUBLE PRECISION;
ALTER TABLE predictions ADD COLUMN IF NOT EXISTS feedback_client TEXT;
CREATE INDEX IF NOT EXISTS predictions_created ON predictions (created);
CREATE INDEX IF NOT EXISTS predictions_feedback ON predictions (model, version, feedback_at);
CREATE INDEX IF NOT EXISTS predictions_client ON predictions (client_request_id, created);
CREATE INDEX IF NOT EXISTS predictions_coverage ON predictions (model, version, coverage, feedback_at)
    WHERE feedback_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS predictions_max_risk ON predictions (model, version, max_risk, feedback_at)
    WHERE feedback_at IS NOT NULL;
CREATE TABLE IF NOT EXISTS client_requests (
    request_id TEXT PRIMARY KEY,
    client_request_id TEXT NOT NULL,
    created DOUBLE PRECISION NOT NULL
);
CREATE INDEX IF NOT EXISTS client_requests_client ON client_requests (client_request_id, created);
CREATE INDEX IF NOT EXISTS client_requests_created ON client_requests (created);
""" + LABEL_SETS_SCHEMA
# as in the SQLite store: the client's request id is stored once per request in client_requests; the predictions
# column keeps the ids of rows written before (or by a replica of an earlier release during an upgrade) readable.
# The decision columns (service.feedback.decisions) and the feedback client are NULL in rows an earlier release
# wrote, as in SQLite.
INSERT = ("INSERT INTO predictions (request_id, idx, model, version, n_samples, class_index, label, confidence, "
          "created, coverage, prediction_set, max_risk, abstain) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, "
          "%s, %s) ON CONFLICT (request_id, idx) DO UPDATE SET model = EXCLUDED.model, version = EXCLUDED.version, "
          "n_samples = EXCLUDED.n_samples, class_index = EXCLUDED.class_index, label = EXCLUDED.label, "
          "confidence = EXCLUDED.confidence, created = EXCLUDED.created, coverage = EXCLUDED.coverage, "
          "prediction_set = EXCLUDED.prediction_set, max_risk = EXCLUDED.max_risk, abstain = EXCLUDED.abstain, "
          "correct = NULL, covered = NULL, recall = NULL, feedback_at = NULL, client_request_id = NULL, "
          "feedback_client = NULL")
# beyond max_rows: the oldest rows but the newest ``kept_labelled`` labelled ones (as in SQLite)
PRUNE_BY_ROWS = ("DELETE FROM predictions WHERE (request_id, idx) IN (SELECT request_id, idx FROM predictions WHERE "
                 "(request_id, idx) NOT IN (SELECT request_id, idx FROM predictions WHERE correct IS NOT NULL ORDER BY "
                 "feedback_at DESC LIMIT %s) ORDER BY created, request_id, idx LIMIT %s)")
INSERT_LABEL_SET = ("INSERT INTO label_sets (model, version, labels, multi_label) VALUES (%s, %s, %s, %s) ON "
                    "CONFLICT (model, version) DO UPDATE SET labels = EXCLUDED.labels, multi_label = "
                    "EXCLUDED.multi_label")
# a logged prediction with its version's labels as they were logged (NULL for rows an earlier release wrote)
LOOKUP = ("SELECT p.model, p.version, p.class_index, p.label, p.prediction_set, s.labels, s.multi_label FROM "
          "predictions p LEFT JOIN label_sets s ON s.model = p.model AND s.version = p.version WHERE p.request_id = "
          "%s AND p.idx = %s")
INSERT_CLIENT_ID = ("INSERT INTO client_requests (request_id, client_request_id, created) VALUES (%s, %s, %s) "
                    "ON CONFLICT (request_id) DO UPDATE SET client_request_id = EXCLUDED.client_request_id, "
                    "created = EXCLUDED.created")
PRUNE_CLIENT_IDS = ("DELETE FROM client_requests WHERE created < COALESCE((SELECT MIN(created) FROM predictions), "
                    "'Infinity'::double precision)")
PREDICTION_OF = ("SELECT request_id FROM (SELECT request_id, created FROM client_requests WHERE client_request_id = "
                 "%s UNION ALL SELECT request_id, created FROM predictions WHERE client_request_id = %s) AS named "
                 "ORDER BY created DESC LIMIT 1")
# replicas serialise schema creation and pruning on this advisory lock (any constant of the application's choosing)
LOCK_KEY = 0x44495245  # "DIRE"
POOL_MIN, POOL_MAX = 1, 4  # the flusher, /feedback and /metrics at once; more replicas mean more connections
CONNECT_TIMEOUT_S = 3  # one connection attempt
WAIT_TIMEOUT_S = 3.0  # a call waiting for a pooled connection before it reports the store unavailable


class PostgresFeedbackStore(FeedbackStore):
    def __init__(self, url: str, max_rows: int, max_age_s: float, window: int) -> None:
        super().__init__(max_rows, max_age_s, window)
        self._schema_ready = False
        self._schema_lock = threading.Lock()
        self._pool = ConnectionPool(url, min_size=POOL_MIN, max_size=POOL_MAX, open=False, timeout=WAIT_TIMEOUT_S,
                                    kwargs={"autocommit": True, "connect_timeout": CONNECT_TIMEOUT_S},
                                    check=ConnectionPool.check_connection, name="director-feedback")
        self._pool.open(wait=False)

    @contextmanager
    def _connection(self) -> Iterator[psycopg.Connection]:
        """A pooled connection (autocommit: use ``conn.transaction()`` for more than one statement), the schema
        in place; a lost or refused connection becomes ``FeedbackUnavailable``."""
        try:
            with self._pool.connection() as conn:
                if not self._schema_ready:
                    self._create_schema(conn)
                yield conn
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            raise FeedbackUnavailable(f"the feedback database is unavailable: {type(exc).__name__}") from exc

    def _create_schema(self, conn: psycopg.Connection) -> None:
        """Then prune, as the SQLite store does on opening: a store opened with tighter bounds applies them."""
        with self._schema_lock:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (LOCK_KEY,))  # CREATE IF NOT EXISTS races otherwise
                conn.execute(SCHEMA)
            self._schema_ready = True
            self._prune_on(conn, time.time() - self.max_age_s)

    def _insert(self, rows: list[Row], label_sets: list[tuple[str, str, str, int]]) -> None:
        with self._connection() as conn, conn.transaction(), conn.cursor() as cur:
            cur.executemany(INSERT, prediction_rows(rows))
            cur.executemany(INSERT_CLIENT_ID, client_ids(rows))
            cur.executemany(INSERT_LABEL_SET, label_sets)

    def _prune(self, cutoff: float) -> int:
        with self._connection() as conn:
            return self._prune_on(conn, cutoff)

    def _prune_on(self, conn: psycopg.Connection, cutoff: float) -> int:
        """Skipped when another replica is pruning the same table (it drops the same rows)."""
        with conn.transaction():
            if not conn.execute("SELECT pg_try_advisory_xact_lock(%s)", (LOCK_KEY,)).fetchone()[0]:
                return 0
            removed = conn.execute("DELETE FROM predictions WHERE created < %s", (cutoff,)).rowcount
            excess = int(conn.execute("SELECT COUNT(*) FROM predictions").fetchone()[0]) - self.max_rows
            if excess > 0:
                removed += conn.execute(PRUNE_BY_ROWS, (self.kept_labelled, excess)).rowcount
            conn.execute(PRUNE_CLIENT_IDS)
            return removed

    def _count(self) -> int:
        with self._connection() as conn:
            return int(conn.execute("SELECT COUNT(*) FROM predictions").fetchone()[0])

    def _lookup(self, request_id: str, index: int) -> LoggedPrediction | None:
        with self._connection() as conn:
            row = conn.execute(LOOKUP, (request_id, index)).fetchone()
        return None if row is None else LoggedPrediction(row[0], row[1], int(row[2]), row[3],
                                                         None if row[4] is None else bytes(row[4]),
                                                         label_set_of(row[5], row[6]))

    def _prediction_of(self, client_request_id: str) -> str | None:
        with self._connection() as conn:
            row = conn.execute(PREDICTION_OF, (client_request_id, client_request_id)).fetchone()
        return None if row is None else str(row[0])

    def _record(self, request_id: str, index: int, correct: bool, covered: bool | None, recall: float | None,
                client: str | None, at: float) -> None:
        with self._connection() as conn:
            conn.execute("UPDATE predictions SET correct = %s, covered = %s, recall = %s, feedback_client = %s, "
                         "feedback_at = %s WHERE request_id = %s AND idx = %s",
                         (int(correct), None if covered is None else int(covered), recall, client, at, request_id,
                          index))

    def _labelled(self, model: str, version: str) -> list[tuple[float, int, str | None]]:
        with self._connection() as conn:
            return conn.execute(
                "SELECT confidence, correct, feedback_client FROM predictions WHERE model = %s AND version = %s AND "
                "correct IS NOT NULL ORDER BY feedback_at DESC, request_id, idx LIMIT %s",
                (model, version, self.window)).fetchall()

    def _levels(self, kind: str, model: str, version: str) -> list[tuple[float, int]]:
        with self._connection() as conn:
            return conn.execute(levels_sql(kind, "%s"), (model, version)).fetchall()

    def _window(self, kind: str, model: str, version: str, level: float) -> list[tuple[float, str | None]]:
        with self._connection() as conn:
            return conn.execute(window_sql(kind, "%s"), (model, version, level, self.window)).fetchall()

    def _labelled_versions(self) -> list[tuple[str, str]]:
        with self._connection() as conn:
            rows = conn.execute("SELECT DISTINCT model, version FROM predictions WHERE correct IS NOT NULL")
            return [(m, v) for m, v in rows.fetchall()]

    def _close(self) -> None:
        self._pool.close()
