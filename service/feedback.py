"""Logged predictions and delayed ground truth in one bounded SQLite file (survives restarts).

Each predicted input is a row keyed by (request id, input index). ``POST /feedback`` sets its true label;
live accuracy and ECE are computed over the latest ``window`` labelled rows of a model version. Rows older
than ``max_age_s`` or beyond the newest ``max_rows`` are pruned.

Writes are behind a buffer: ``log`` (called on the event loop for every answered request) only appends to a
list, and ``flush`` writes what has gathered in one transaction, every ``FLUSH_INTERVAL_S`` from the app (in a
thread) and before any read, so a prediction is visible to ``/feedback`` as soon as its response is sent. A
crash of the process loses at most the last interval's log, never a response."""

from __future__ import annotations

import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from models.uncertainty import expected_calibration_error

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
    PRIMARY KEY (request_id, idx)
);
CREATE INDEX IF NOT EXISTS predictions_created ON predictions (created);
CREATE INDEX IF NOT EXISTS predictions_feedback ON predictions (model, version, feedback_at);
"""
FLUSH_INTERVAL_S = 0.1
INSERT = ("INSERT OR REPLACE INTO predictions (request_id, idx, model, version, n_samples, class_index, label, "
          "confidence, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)")


@dataclass(frozen=True)
class LoggedPrediction:
    model: str
    version: str
    class_index: int
    label: str


@dataclass(frozen=True)
class LiveStats:
    accuracy: float
    ece: float
    n: int


class FeedbackStore:
    def __init__(self, path: Path, max_rows: int, max_age_s: float, window: int) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.max_rows, self.max_age_s, self.window = max_rows, max_age_s, window
        self._lock = threading.Lock()  # the connection; taken before _pending_lock when both are held
        self._pending_lock = threading.Lock()
        self._pending: list[tuple] = []  # rows logged and not yet written, oldest first
        self._conn = sqlite3.connect(str(path), check_same_thread=False, timeout=10.0, isolation_level=None)
        self._conn.execute("PRAGMA journal_mode=WAL")
        # in WAL mode NORMAL still survives a crash of the process (not of the machine) without an fsync per commit
        self._conn.execute("PRAGMA synchronous=NORMAL")
        self._conn.executescript(SCHEMA)
        self._inserts = 0
        self.prune()

    def close(self) -> None:
        self.flush()
        with self._lock:
            self._conn.close()

    def log(self, request_id: str, model: str, version: str, n_samples: int,
            rows: list[tuple[int, str, float]]) -> None:
        """Log one request's predictions: ``rows`` of (class_index, label, confidence) in input order. No I/O: the
        rows are written by the next ``flush``."""
        now = time.time()
        logged = [(request_id, i, model, version, n_samples, c, lab, conf, now)
                  for i, (c, lab, conf) in enumerate(rows)]
        with self._pending_lock:
            self._pending.extend(logged)
            overflow = len(self._pending) - self.max_rows
            if overflow > 0:  # older than the newest max_rows: pruning would drop them anyway
                del self._pending[:overflow]

    @property
    def pending(self) -> int:
        """Rows logged and not yet written."""
        return len(self._pending)

    def flush(self) -> int:
        """Write the logged rows in one transaction; returns how many."""
        with self._lock:
            with self._pending_lock:
                rows, self._pending = self._pending, []
            if not rows:
                return 0
            self._conn.execute("BEGIN")
            try:
                self._conn.executemany(INSERT, rows)
            except BaseException:
                self._conn.execute("ROLLBACK")
                with self._pending_lock:  # kept for the next flush, ahead of what came since
                    self._pending[:0] = rows
                raise
            self._conn.execute("COMMIT")
            self._inserts += len(rows)
            due = self._inserts >= max(1, min(1000, self.max_rows // 10))
        if due:
            self.prune()
        return len(rows)

    def prune(self) -> int:
        """Drop rows past the age and row limits."""
        self.flush()
        with self._lock:
            self._inserts = 0
            cur = self._conn.execute("DELETE FROM predictions WHERE created < ?", (time.time() - self.max_age_s,))
            removed = cur.rowcount
            cur = self._conn.execute(
                "DELETE FROM predictions WHERE rowid IN (SELECT rowid FROM predictions ORDER BY created DESC, "
                "rowid DESC LIMIT -1 OFFSET ?)", (self.max_rows,))
            return removed + cur.rowcount

    def count(self) -> int:
        self.flush()
        with self._lock:
            return int(self._conn.execute("SELECT COUNT(*) FROM predictions").fetchone()[0])

    def lookup(self, request_id: str, index: int) -> LoggedPrediction | None:
        self.flush()
        with self._lock:
            row = self._conn.execute("SELECT model, version, class_index, label FROM predictions "
                                     "WHERE request_id = ? AND idx = ?", (request_id, index)).fetchone()
        return None if row is None else LoggedPrediction(row[0], row[1], int(row[2]), row[3])

    def record(self, request_id: str, index: int, correct: bool) -> None:
        self.flush()
        with self._lock:
            self._conn.execute("UPDATE predictions SET correct = ?, feedback_at = ? WHERE request_id = ? AND idx = ?",
                               (int(correct), time.time(), request_id, index))

    def live_stats(self, model: str, version: str) -> LiveStats | None:
        self.flush()
        with self._lock:
            rows = self._conn.execute(
                "SELECT confidence, correct FROM predictions WHERE model = ? AND version = ? AND correct IS NOT "
                "NULL ORDER BY feedback_at DESC LIMIT ?", (model, version, self.window)).fetchall()
        if not rows:
            return None
        return LiveStats(accuracy=sum(c for _, c in rows) / len(rows), ece=live_ece(rows),
                         n=len(rows))

    def labelled_versions(self) -> list[tuple[str, str]]:
        self.flush()
        with self._lock:
            rows = self._conn.execute("SELECT DISTINCT model, version FROM predictions WHERE correct IS NOT NULL")
            return [(m, v) for m, v in rows.fetchall()]


def live_ece(rows: list[tuple[float, int]]) -> float:
    """ECE of logged (confidence, correct) rows, with the evaluation's and the manifest's estimator and binning."""
    confidence = torch.tensor([c for c, _ in rows], dtype=torch.float64)  # [N]
    correct = torch.tensor([k for _, k in rows], dtype=torch.float64)  # [N]
    return expected_calibration_error(confidence, correct)
