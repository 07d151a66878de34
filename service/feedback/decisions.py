"""What the prediction log keeps of a request's prediction sets and abstentions, and the live coverage and selective
risk computed from it once labels arrive (docs/operations.md, "Live coverage and selective risk").

Per input, a request that asked for ``coverage`` logs the level and its set as a bitmask (bit ``i`` for label ``i``,
little-endian bytes, trailing zeros dropped: at most ``ceil(num_classes / 8)`` bytes, 2 for ten classes); one that
asked for ``max_risk`` logs it and the input's abstention. ``/feedback`` turns the set and the true label into a
``covered`` flag, or for a multi-label version the set's ``recall`` (the share of the true labels it held, 1 when
there is none: what its guarantee bounds on average), so live coverage is the covered share or the mean recall. Both
statistics are read like live accuracy: the latest ``window`` rows of a level, newest label first, ties in key order;
per version and kind at most ``MAX_LEVELS`` levels are exported (``exported_levels``): those exported before that are
still short of their promise, then those with the most labelled rows in the store (ties: the smaller level), so a
client cycling through levels can neither grow the series without bound nor push out a level whose alert may fire.
Each row carries the feedback client that labelled it, so a level also reports how many clients fed its window and
a robust reading that no single client can make look bad (``live_rate``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

MAX_LEVELS = 16  # levels exported per model version and per kind (coverage, max_risk)


@dataclass(frozen=True)
class DecisionLog:
    """One request's decisions as the log keeps them: per input a set (``set_mask``) and an abstention, each None
    when not asked."""

    coverage: float | None
    sets: Sequence[bytes] | None
    max_risk: float | None
    abstain: Sequence[bool] | None

    def row(self, index: int) -> tuple[float | None, bytes | None, float | None, int | None]:
        """The log's columns for input ``index``: coverage, prediction_set, max_risk, abstain."""
        sets, abstain = self.sets, self.abstain
        return (self.coverage if sets is not None else None, sets[index] if sets is not None else None,
                self.max_risk if abstain is not None else None, int(abstain[index]) if abstain is not None else None)


NO_DECISIONS = (None, None, None, None)


@dataclass(frozen=True)
class LiveRate:
    value: float  # covered share or mean recall (coverage), or error rate among answered inputs (selective risk)
    n: int  # labelled rows behind it (answered ones, for selective risk)
    clients: int  # distinct feedback clients among those rows
    robust_value: float  # the most favourable of the value and the value without one minority client (``live_rate``)
    robust_n: int  # rows behind robust_value


@dataclass(frozen=True)
class LiveDecisions:
    coverage: dict[float, LiveRate]  # by requested coverage
    selective_risk: dict[float, LiveRate]  # by requested max_risk

    def of(self, kind: str) -> dict[float, LiveRate]:
        return self.coverage if kind == "coverage" else self.selective_risk

    def by_kind(self) -> dict[str, dict[float, LiveRate]]:
        return {"coverage": self.coverage, "selective_risk": self.selective_risk}


NO_LIVE_DECISIONS = LiveDecisions({}, {})


def set_mask(indices: Sequence[int]) -> bytes:
    """A set of label indices as the log stores it."""
    mask = 0
    for index in indices:
        mask |= 1 << index
    return mask.to_bytes((mask.bit_length() + 7) // 8, "little")


def in_set(mask: bytes, index: int) -> bool:
    byte, bit = divmod(index, 8)
    return 0 <= byte < len(mask) and bool(mask[byte] >> bit & 1)


# (level column, the row's outcome: 1 = covered (or a multi-label set's recall) / 1 = wrong, which rows count) of each
# kind; constants, never input. ``feedback_at IS NOT NULL`` (true of every labelled row) lets the windows' partial
# indexes serve them: only labelled rows are indexed, so unlabelled traffic grows no index
KINDS = {
    "coverage": ("coverage", "COALESCE(recall, covered)",
                 "feedback_at IS NOT NULL AND COALESCE(recall, covered) IS NOT NULL"),
    "selective_risk": ("max_risk", "1 - correct",
                       "feedback_at IS NOT NULL AND max_risk IS NOT NULL AND abstain = 0 AND correct IS NOT NULL"),
}


def levels_sql(kind: str, placeholder: str) -> str:
    """A version's levels of ``kind`` and the labelled rows each has in the store. Parameters: model, version."""
    level, _, where = KINDS[kind]
    p = placeholder
    return f"SELECT {level}, COUNT(*) FROM predictions WHERE model = {p} AND version = {p} AND {where} GROUP BY {level}"


def window_sql(kind: str, placeholder: str) -> str:
    """The latest labelled rows of one level: (outcome, feedback client), newest label first, ties in key order.
    Parameters: model, version, level, window."""
    level, outcome, where = KINDS[kind]
    p = placeholder
    return (f"SELECT {outcome}, feedback_client FROM predictions WHERE model = {p} AND version = {p} AND {level} = {p} "
            f"AND {where} ORDER BY feedback_at DESC, request_id, idx LIMIT {p}")


def short_of_promise(kind: str, level: float, value: float) -> bool:
    """Whether a level's live value is on the wrong side of what it asked for: coverage under it, risk over it."""
    return value < level if kind == "coverage" else value > level


def exported_levels(kind: str, counts: Mapping[float, int], previous: Mapping[float, LiveRate]) -> list[float]:
    """The ``MAX_LEVELS`` levels exported: those exported last time that are still short of their promise and still
    have rows come first (a level whose alert may be firing is never pushed out by new ones), then the most labelled
    (ties: the smaller level)."""
    kept = [level for level, rate in previous.items()
            if level in counts and short_of_promise(kind, level, rate.value)][:MAX_LEVELS]
    rest = sorted((level for level in counts if level not in kept), key=lambda level: (-counts[level], level))
    return kept + rest[: MAX_LEVELS - len(kept)]


def live_rate(kind: str, rows: Sequence[tuple[float, str | None]]) -> LiveRate:
    """A level's window of (outcome, client) rows -> its rate, its clients, and its robust reading: the most favourable
    of the whole window and the window without any one *minority* client (one that sent at most half its rows). A
    client's labels alone can then neither make the robust reading look bad (leave it out) nor, while the other
    clients are the majority, hide what their labels say beyond diluting it by its share (docs/operations.md, "Who
    can move the live gauges")."""
    total = sum(float(outcome) for outcome, _ in rows)
    by_client: dict[str, tuple[float, int]] = {}
    for outcome, client in rows:
        hits, n = by_client.get(client or "", (0.0, 0))
        by_client[client or ""] = (hits + float(outcome), n + 1)
    readings = [(total / len(rows), len(rows))]
    readings += [((total - hits) / (len(rows) - n), len(rows) - n) for hits, n in by_client.values()
                 if 2 * n <= len(rows) and n < len(rows)]
    pick = max if kind == "coverage" else min  # coverage: the highest reading; risk: the lowest
    robust_value, robust_n = pick(readings, key=lambda reading: reading[0])
    return LiveRate(readings[0][0], len(rows), len(by_client), robust_value, robust_n)
