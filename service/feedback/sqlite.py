"""The embedded feedback store: one SQLite file per server (the default; survives restarts, not shared)."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

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
    idx INTEGER NOT NULL,
    model TEXT NOT NULL,
    version TEXT NOT NULL,
    n_samples INTEGER NOT NULL,
    class_index INTEGER NOT NULL,
    label TEXT NOT NULL,
    confidence REAL NOT NULL,
    created REAL NOT NULL,
    correct INTEGER,
    feedback_at REAL,
    client_request_id TEXT,
    coverage REAL,
    prediction_set BLOB,
    max_risk REAL,
    abstain INTEGER,
    covered INTEGER,
    recall REAL,
    feedback_client TEXT,
    PRIMARY KEY (request_id, idx)
);
CREATE INDEX IF NOT EXISTS predictions_created ON predictions (created);
CREATE INDEX IF NOT EXISTS predictions_feedback ON predictions (model, version, feedback_at);
CREATE TABLE IF NOT EXISTS client_requests (
    request_id TEXT PRIMARY KEY,
    client_request_id TEXT NOT NULL,
    created REAL NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS client_requests_client ON client_requests (client_request_id, created);
CREATE INDEX IF NOT EXISTS client_requests_created ON client_requests (created);
""" + LABEL_SETS_SCHEMA
# the client's request id was once a column of every prediction row: a database written then keeps its rows' ids
# readable there (new rows leave it NULL and store the id once in client_requests); an older one gains the column
CLIENT_ID_COLUMN = "ALTER TABLE predictions ADD COLUMN client_request_id TEXT"
CLIENT_ID_INDEX = "CREATE INDEX IF NOT EXISTS predictions_client ON predictions (client_request_id, created)"
# a request's prediction sets and abstentions (service.feedback.decisions), and the label's verdict on the set; NULL in
# rows logged before these columns existed, or by a request that asked for neither
# and the feedback client that sent the label (NULL before it was kept: those labels count as one client)
DECISION_COLUMNS = {"coverage": "REAL", "prediction_set": "BLOB", "max_risk": "REAL", "abstain": "INTEGER",
                    "covered": "INTEGER", "recall": "REAL", "feedback_client": "TEXT"}
# each live window's read is one index range of at most ``window`` rows, whatever the labelled rows in the store
WINDOW_INDEXES = ("CREATE INDEX IF NOT EXISTS predictions_coverage ON predictions (model, version, coverage, "
                  "feedback_at) WHERE feedback_at IS NOT NULL",
                  "CREATE INDEX IF NOT EXISTS predictions_max_risk ON predictions (model, version, max_risk, "
                  "feedback_at) WHERE feedback_at IS NOT NULL")
INSERT = ("INSERT OR REPLACE INTO predictions (request_id, idx, model, version, n_samples, class_index, label, "
          "confidence, created, coverage, prediction_set, max_risk, abstain) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, "
          "?, ?)")
INSERT_LABEL_SET = "INSERT OR REPLACE INTO label_sets (model, version, labels, multi_label) VALUES (?, ?, ?, ?)"
# a logged prediction with its version's labels as they were logged (NULL for rows an earlier release wrote)
LOOKUP = ("SELECT p.model, p.version, p.class_index, p.label, p.prediction_set, s.labels, s.multi_label FROM "
          "predictions p LEFT JOIN label_sets s ON s.model = p.model AND s.version = p.version WHERE p.request_id = "
          "? AND p.idx = ?")
INSERT_CLIENT_ID = "INSERT OR REPLACE INTO client_requests (request_id, client_request_id, created) VALUES (?, ?, ?)"
# beyond max_rows: the oldest rows but the newest ``kept_labelled`` labelled ones
PRUNE_BY_ROWS = ("DELETE FROM predictions WHERE rowid IN (SELECT rowid FROM predictions WHERE rowid NOT IN (SELECT "
                 "rowid FROM predictions WHERE correct IS NOT NULL ORDER BY feedback_at DESC LIMIT ?) ORDER BY "
                 "created, rowid LIMIT ?)")
# a client id whose request has no row left goes with it: rows are pruned oldest first, so those are the ones older
# than the oldest row (all of them when no row is left)
PRUNE_CLIENT_IDS = ("DELETE FROM client_requests WHERE created < COALESCE((SELECT MIN(created) FROM predictions), "
                    "9e999)")
PREDICTION_OF = ("SELECT request_id FROM (SELECT request_id, created FROM client_requests WHERE client_request_id = ? "
                 "UNION ALL SELECT request_id, created FROM predictions WHERE client_request_id = ?) ORDER BY created "
                 "DESC LIMIT 1")


class SqliteFeedbackStore(FeedbackStore):
    def __init__(self, path: Path, max_rows: int, max_age_s: float, window: int, busy_timeout_s: float = 10.0) -> None:
        """``busy_timeout_s``: how long a call waits on another process's lock before it fails; the server passes
        its store-call timeout, so a thread gives up about when its caller does instead of staying busy after."""
        super().__init__(max_rows, max_age_s, window)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()  # the connection
        self._conn = sqlite3.connect(str(path), check_same_thread=False, timeout=busy_timeout_s,
                                     isolation_level=None)
        self._conn.execute("PRAGMA journal_mode=WAL")
        # in WAL mode NORMAL still survives a crash of the process (not of the machine) without an fsync per commit
        self._conn.execute("PRAGMA synchronous=NORMAL")
        self._conn.executescript(SCHEMA)
        self._migrate()
        self.prune()

    def _migrate(self) -> None:
        """A database of an earlier release gains the columns it lacks; its rows keep NULL there."""
        columns = {row[1] for row in self._conn.execute("PRAGMA table_info(predictions)")}
        if "client_request_id" not in columns:
            self._conn.execute(CLIENT_ID_COLUMN)
        self._conn.execute(CLIENT_ID_INDEX)
        for name, kind in DECISION_COLUMNS.items():
            if name not in columns:
                self._conn.execute(f"ALTER TABLE predictions ADD COLUMN {name} {kind}")
        for index in WINDOW_INDEXES:
            self._conn.execute(index)

    @contextmanager
    def _database(self) -> Iterator[None]:
        """The connection, held; any SQLite error (locked past the busy timeout, disk full, read-only, corrupt) is
        ``FeedbackUnavailable``: /feedback answers 503 and the prediction log keeps its rows for the next flush."""
        with self._lock:
            try:
                yield
            except sqlite3.Error as exc:
                raise FeedbackUnavailable(f"the feedback database cannot be used: {type(exc).__name__}: "
                                          f"{exc}") from exc

    def _insert(self, rows: list[Row], label_sets: list[tuple[str, str, str, int]]) -> None:
        with self._database():
            self._conn.execute("BEGIN")
            try:
                self._conn.executemany(INSERT, prediction_rows(rows))
                self._conn.executemany(INSERT_CLIENT_ID, client_ids(rows))
                self._conn.executemany(INSERT_LABEL_SET, label_sets)
            except BaseException:
                if self._conn.in_transaction:  # SQLite rolls back itself on some errors (a full disk, SQLITE_FULL)
                    self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def _prune(self, cutoff: float) -> int:
        with self._database():
            removed = self._conn.execute("DELETE FROM predictions WHERE created < ?", (cutoff,)).rowcount
            excess = int(self._conn.execute("SELECT COUNT(*) FROM predictions").fetchone()[0]) - self.max_rows
            if excess > 0:
                removed += self._conn.execute(PRUNE_BY_ROWS, (self.kept_labelled, excess)).rowcount
            self._conn.execute(PRUNE_CLIENT_IDS)
            return removed

    def _count(self) -> int:
        with self._database():
            return int(self._conn.execute("SELECT COUNT(*) FROM predictions").fetchone()[0])

    def _lookup(self, request_id: str, index: int) -> LoggedPrediction | None:
        with self._database():
            row = self._conn.execute(LOOKUP, (request_id, index)).fetchone()
        return None if row is None else LoggedPrediction(row[0], row[1], int(row[2]), row[3], row[4],
                                                         label_set_of(row[5], row[6]))

    def _prediction_of(self, client_request_id: str) -> str | None:
        with self._database():
            row = self._conn.execute(PREDICTION_OF, (client_request_id, client_request_id)).fetchone()
        return None if row is None else str(row[0])

    def _record(self, request_id: str, index: int, correct: bool, covered: bool | None, recall: float | None,
                client: str | None, at: float) -> None:
        with self._database():
            self._conn.execute("UPDATE predictions SET correct = ?, covered = ?, recall = ?, feedback_client = ?, "
                               "feedback_at = ? WHERE request_id = ? AND idx = ?",
                               (int(correct), None if covered is None else int(covered), recall, client, at,
                                request_id, index))

    def _labelled(self, model: str, version: str) -> list[tuple[float, int, str | None]]:
        with self._database():
            return self._conn.execute(
                "SELECT confidence, correct, feedback_client FROM predictions WHERE model = ? AND version = ? AND "
                "correct IS NOT NULL ORDER BY feedback_at DESC, request_id, idx LIMIT ?",
                (model, version, self.window)).fetchall()

    def _levels(self, kind: str, model: str, version: str) -> list[tuple[float, int]]:
        with self._database():
            return self._conn.execute(levels_sql(kind, "?"), (model, version)).fetchall()

    def _window(self, kind: str, model: str, version: str, level: float) -> list[tuple[float, str | None]]:
        with self._database():
            return self._conn.execute(window_sql(kind, "?"), (model, version, level, self.window)).fetchall()

    def _labelled_versions(self) -> list[tuple[str, str]]:
        with self._database():
            rows = self._conn.execute("SELECT DISTINCT model, version FROM predictions WHERE correct IS NOT NULL")
            return [(m, v) for m, v in rows.fetchall()]

    def _close(self) -> None:
        with self._lock:
            self._conn.close()
