"""Logged predictions and delayed ground truth: the store interface, its write buffer and the choice of backend.

Each predicted input is a row keyed by (request id, input index); the client's own request id (``X-Request-ID``, or
gRPC's OIP ``id``), when there is one, is stored once per request beside them, not once per row, so a request grows
the store by its rows' fixed size plus one id whatever its id's length. ``POST /feedback`` sets its true label;
live accuracy and ECE are computed over the latest ``window`` labelled rows of a model version, and live coverage
and selective risk over those of each level a request asked for (``service.feedback.decisions``). Each label keeps
the feedback client that sent it (the feedback key's name, else the peer's address). Rows older than ``max_age_s``
are pruned; beyond ``max_rows`` the oldest rows go, except the newest ``max_rows * LABELLED_SHARE`` labelled ones:
unlabelled predictions are pruned before those whatever the prediction volume, so unlabelled traffic cannot erase the
live windows, and labelled rows past that share age out like the rest, so new predictions always have room. Each
version's labels are stored once as they were logged (``LabelSet``), so feedback is checked against them whether or
not the version is loaded. Two backends keep the same schema and bounds: an embedded SQLite file
(``service.feedback.sqlite``, the default) and PostgreSQL (``service.feedback.postgres``, when replicas must share one
store: ``DIRECTOR_FEEDBACK_URL``).

Writes are behind a buffer: ``log`` (called on the event loop for every answered request) only appends to a
list, and ``flush`` writes what has gathered in one transaction, every ``FLUSH_INTERVAL_S`` from the app (in a
thread) and before any read, so a prediction is visible to ``/feedback`` as soon as its response is sent. A
crash of the process loses at most the last interval's log, never a response; a database that is away keeps the
newest ``max_rows`` rows waiting for it, and never fails a prediction."""

from __future__ import annotations

import json
import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

import torch

from models.uncertainty import expected_calibration_error
from service.feedback.decisions import (
    KINDS,
    NO_DECISIONS,
    NO_LIVE_DECISIONS,
    DecisionLog,
    LiveDecisions,
    LiveRate,
    exported_levels,
    live_rate,
)

log = logging.getLogger("service.feedback.store")

FLUSH_INTERVAL_S = 0.1
LABELLED_SHARE = 0.5  # of max_rows: the newest labelled rows pruning keeps while unlabelled rows are left to prune
FLUSH_CHUNK = 1000  # rows per transaction: a store short of space still takes a small one once space returns
Row = tuple[str, int, str, str, int, int, str, float, float, float | None, bytes | None, float | None, int | None,
            str | None]  # request_id (the prediction id), idx, model, version, n_samples, class_index, label,
# confidence, created, coverage, prediction_set, max_risk, abstain (``DecisionLog.row``), client_request_id (the
# X-Request-ID of the request that made it, shared by its rows in memory and stored once per request: ``client_ids``)
STORED = 13  # the columns of a row the predictions table stores (all but the client's id)
ClientId = tuple[str, str, float]
# each version's labels as its predictions were logged (``LabelSet``), in the same words for both backends
LABEL_SETS_SCHEMA = """
CREATE TABLE IF NOT EXISTS label_sets (
    model TEXT NOT NULL,
    version TEXT NOT NULL,
    labels TEXT NOT NULL,
    multi_label INTEGER NOT NULL,
    PRIMARY KEY (model, version)
);
"""  # request_id, client_request_id, created: one per request that carried an id


@dataclass(frozen=True)
class LabelSet:
    """A version's labels as its predictions were logged: feedback is checked against them, loaded or not."""

    labels: tuple[str, ...]
    multi_label: bool

    def row(self, model: str, version: str) -> tuple[str, str, str, int]:
        return model, version, json.dumps(list(self.labels)), int(self.multi_label)


@dataclass(frozen=True)
class LoggedPrediction:
    model: str
    version: str
    class_index: int
    label: str
    prediction_set: bytes | None = None  # the logged set's bitmask, when the request asked for coverage
    label_set: LabelSet | None = None  # None for rows an earlier release logged


def label_set_of(labels: str | None, multi_label: int | None) -> LabelSet | None:
    """A ``label_sets`` row's columns (NULL from a LEFT JOIN: the row predates them)."""
    return None if labels is None else LabelSet(tuple(json.loads(labels)), bool(multi_label))


@dataclass(frozen=True)
class LiveStats:
    accuracy: float
    ece: float
    n: int
    clients: int  # distinct feedback clients among the n rows


class FeedbackUnavailable(Exception):
    """The store cannot be reached (a shared database that is down or out of connections): worth a retry."""


class FeedbackStore(ABC):
    """The write buffer shared by the backends; they implement storage in the ``_``-prefixed methods, each one
    transaction."""

    def __init__(self, max_rows: int, max_age_s: float, window: int) -> None:
        self.max_rows, self.max_age_s, self.window = max_rows, max_age_s, window
        self._flush_lock = threading.Lock()  # one flush at a time; taken before _pending_lock
        self._pending_lock = threading.Lock()
        self._pending: list[Row] = []  # rows logged and not yet written, oldest first
        self._pending_sets: dict[tuple[str, str], LabelSet] = {}  # label sets not yet written
        self._written_sets: dict[tuple[str, str], LabelSet] = {}  # label sets written (or queued) by this process
        self._writing = 0  # rows a flush has taken from _pending and not yet written
        self._inserts = 0
        self.dropped = 0  # rows dropped unwritten (the buffer past max_rows, or at close)
        self.on_drop: Callable[[int], None] | None = None  # told of every drop (a metric)

    def log(self, request_id: str, model: str, version: str, n_samples: int,
            rows: list[tuple[int, str, float]], client_request_id: str | None = None,
            decisions: DecisionLog | None = None, label_set: LabelSet | None = None) -> None:
        """Log one request's predictions: ``rows`` of (class_index, label, confidence) in input order, with the
        request id the client sent (or was given), so that ``/feedback`` can name either, and the sets and
        abstentions it asked for. No I/O: the rows are written by the next ``flush``."""
        now = time.time()
        logged: list[Row] = [(request_id, i, model, version, n_samples, c, lab, conf, now,
                              *(decisions.row(i) if decisions is not None else NO_DECISIONS), client_request_id)
                             for i, (c, lab, conf) in enumerate(rows)]
        with self._pending_lock:
            self._pending.extend(logged)
            if label_set is not None and self._written_sets.get((model, version)) != label_set:
                self._pending_sets[(model, version)] = self._written_sets[(model, version)] = label_set
            overflow = len(self._pending) - self.max_rows
            if overflow > 0:  # older than the newest max_rows: pruning would drop them anyway
                del self._pending[:overflow]
        if overflow > 0:
            self._dropped(overflow)

    def _dropped(self, rows: int) -> None:
        self.dropped += rows
        if self.on_drop is not None:
            self.on_drop(rows)

    @property
    def pending(self) -> int:
        """Rows logged and not yet written: queued, or in a write still in progress (a write a lock holds up)."""
        with self._pending_lock:
            return len(self._pending) + self._writing

    def flush(self) -> int:
        """Write the logged rows, oldest first, in transactions of at most ``FLUSH_CHUNK`` rows; returns how many.
        On failure the unwritten rows stay queued, in order (what was written stays written)."""
        with self._flush_lock:
            with self._pending_lock:
                rows, self._pending = self._pending, []
                sets, self._pending_sets = self._pending_sets, {}
                self._writing = len(rows)
            if not rows and not sets:
                return 0
            written = 0
            try:
                for start in range(0, max(1, len(rows)), FLUSH_CHUNK):
                    chunk = rows[start : start + FLUSH_CHUNK]
                    self._insert(chunk, [] if start else [label_set.row(*key) for key, label_set in sets.items()])
                    written += len(chunk)
                    sets = {}
                    with self._pending_lock:
                        self._writing = len(rows) - written
            except BaseException:
                with self._pending_lock:  # kept for the next flush, ahead of what came since
                    self._pending[:0] = rows[written:]
                    self._pending_sets = {**sets, **self._pending_sets}
                    self._writing = 0
                    overflow = max(0, len(self._pending) - self.max_rows)
                    del self._pending[:overflow]
                if overflow:
                    self._dropped(overflow)
                raise
            finally:
                self._inserts += written
            due = self._inserts >= max(1, min(1000, self.max_rows // 10))
        if due:
            self.prune()
        return len(rows)

    def prune(self) -> int:
        """Drop rows past the age and row limits; returns how many."""
        self.flush()
        self._inserts = 0
        return self._prune(time.time() - self.max_age_s)

    def close(self) -> None:
        """Write what is pending (what cannot be written is reported and lost), then release the backend."""
        try:
            self.flush()
        except Exception:
            log.exception("closing the feedback store: %d logged predictions not written", self.pending)
            self._dropped(self.pending)
        self._close()

    def count(self) -> int:
        self.flush()
        return self._count()

    def lookup(self, request_id: str, index: int) -> LoggedPrediction | None:
        self.flush()
        return self._lookup(request_id, index)

    def prediction_of(self, client_request_id: str) -> str | None:
        """The prediction id logged for the newest request that carried ``client_request_id``, if any."""
        self.flush()
        return self._prediction_of(client_request_id)

    def record(self, request_id: str, index: int, correct: bool, covered: bool | None = None,
               recall: float | None = None, client: str | None = None) -> None:
        """The true label's verdicts: right or wrong, and whether the logged set held it (None: no set, or the
        label's index is unknown); for a multi-label input, the share of its true labels the logged set held; and
        the feedback client that sent it."""
        self.flush()
        self._record(request_id, index, correct, covered, recall, client, time.time())

    @property
    def kept_labelled(self) -> int:
        """Labelled rows pruning keeps ahead of unlabelled ones."""
        return int(self.max_rows * LABELLED_SHARE)

    def live_stats(self, model: str, version: str) -> LiveStats | None:
        """Accuracy and ECE over the latest ``window`` labelled rows (newest label first, ties in key order, so
        every replica reading one database computes the same numbers)."""
        self.flush()
        rows = self._labelled(model, version)
        if not rows:
            return None
        scored = [(confidence, correct) for confidence, correct, _ in rows]
        return LiveStats(accuracy=sum(c for _, c in scored) / len(rows), ece=live_ece(scored), n=len(rows),
                         clients=len({client or "" for _, _, client in rows}))

    def live_decisions(self, model: str, version: str, previous: LiveDecisions = NO_LIVE_DECISIONS) -> LiveDecisions:
        """Coverage and selective risk of the exported levels (``decisions.exported_levels``, given what was
        exported ``previous``ly), each over its latest ``window`` rows (the answered ones for selective risk), read
        and ordered as ``live_stats`` reads its rows: one indexed read of at most ``window`` rows per level."""
        self.flush()
        found: dict[str, dict[float, LiveRate]] = {}
        for kind in KINDS:
            counts = {float(level): int(n) for level, n in self._levels(kind, model, version)}
            found[kind] = {level: live_rate(kind, self._window(kind, model, version, level))
                           for level in exported_levels(kind, counts, previous.of(kind))}
        return LiveDecisions(found["coverage"], found["selective_risk"])

    def labelled_versions(self) -> list[tuple[str, str]]:
        self.flush()
        return self._labelled_versions()

    @abstractmethod
    def _insert(self, rows: list[Row], label_sets: list[tuple[str, str, str, int]]) -> None:
        """Insert (or replace) ``rows`` and the versions' ``label_sets`` (``LabelSet.row``) in one transaction."""

    @abstractmethod
    def _prune(self, cutoff: float) -> int: ...

    @abstractmethod
    def _count(self) -> int: ...

    @abstractmethod
    def _lookup(self, request_id: str, index: int) -> LoggedPrediction | None: ...

    @abstractmethod
    def _prediction_of(self, client_request_id: str) -> str | None: ...

    @abstractmethod
    def _record(self, request_id: str, index: int, correct: bool, covered: bool | None, recall: float | None,
                client: str | None, at: float) -> None: ...

    @abstractmethod
    def _labelled(self, model: str, version: str) -> list[tuple[float, int, str | None]]:
        """(confidence, correct, feedback client) of the latest ``window`` labelled rows."""

    @abstractmethod
    def _levels(self, kind: str, model: str, version: str) -> list[tuple[float, int]]:
        """``decisions.levels_sql`` of ``kind`` on the version."""

    @abstractmethod
    def _window(self, kind: str, model: str, version: str, level: float) -> list[tuple[float, str | None]]:
        """``decisions.window_sql`` of ``kind`` on one level of the version."""

    @abstractmethod
    def _labelled_versions(self) -> list[tuple[str, str]]: ...

    @abstractmethod
    def _close(self) -> None: ...


def prediction_rows(rows: list[Row]) -> list[tuple[object, ...]]:
    """The columns of a prediction row, the client's request id left out (``client_ids`` stores it)."""
    return [row[:STORED] for row in rows]


def client_ids(rows: list[Row]) -> list[ClientId]:
    """One (request id, client's request id, created) per request among ``rows`` that carried one: a 256-input request
    stores its client's id once, not 256 times."""
    return list({row[0]: (row[0], row[STORED], row[8]) for row in rows if row[STORED] is not None}.values())


def live_ece(rows: list[tuple[float, int]]) -> float:
    """ECE of logged (confidence, correct) rows, with the evaluation's and the manifest's estimator and binning."""
    confidence = torch.tensor([c for c, _ in rows], dtype=torch.float64)  # [N]
    correct = torch.tensor([k for _, k in rows], dtype=torch.float64)  # [N]
    return expected_calibration_error(confidence, correct)
