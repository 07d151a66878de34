"""What the prediction log keeps of a request's prediction sets and abstentions, and the live coverage and selective
risk computed from it once labels arrive (docs/operations.md, "Live coverage and selective risk").

Per input, a request that asked for ``coverage`` logs the level and its set as a bitmask (bit ``i`` for label ``i``,
little-endian bytes, trailing zeros dropped: at most ``ceil(num_classes / 8)`` bytes, 2 for ten classes); one that
asked for ``max_risk`` logs it and the input's abstention. ``/feedback`` turns the set and the true label into a
``covered`` flag, or for a multi-label version the set's ``recall`` (the share of the true labels it held, 1 when
there is none: what its guarantee bounds on average), so live coverage is the covered share or the mean recall. Both
statistics are read like live accuracy: the latest ``window`` rows of a level, newest label first, ties in key order;
per version and kind at most ``MAX_LEVELS`` levels are exported, those with the most labelled rows in the store
(ties: the smaller level), so a client cycling through levels cannot grow the series without bound. The rest are not
exported."""

from __future__ import annotations

from collections.abc import Sequence
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


@dataclass(frozen=True)
class LiveDecisions:
    coverage: dict[float, LiveRate]  # by requested coverage
    selective_risk: dict[float, LiveRate]  # by requested max_risk


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
# kind; constants, never input
KINDS = {
    "coverage": ("coverage", "COALESCE(recall, covered)", "COALESCE(recall, covered) IS NOT NULL"),
    "selective_risk": ("max_risk", "1 - correct", "max_risk IS NOT NULL AND abstain = 0 AND correct IS NOT NULL"),
}


def window_sql(kind: str, placeholder: str) -> str:
    """Per level of a version: rows in its window, their outcomes' sum, and the level's labelled rows in the store.
    Parameters: model, version, window."""
    level, outcome, where = KINDS[kind]
    p = placeholder
    return (f"SELECT level, COUNT(*), SUM(outcome), MAX(total) FROM (SELECT {level} AS level, {outcome} AS outcome, "
            f"ROW_NUMBER() OVER (PARTITION BY {level} ORDER BY feedback_at DESC, request_id, idx) AS rank, "
            f"COUNT(*) OVER (PARTITION BY {level}) AS total FROM predictions WHERE model = {p} AND version = {p} AND "
            f"{where}) AS recent WHERE rank <= {p} GROUP BY level")


def live_rates(rows: Sequence[tuple[float, int, int, int]]) -> dict[float, LiveRate]:
    """``window_sql``'s rows -> the exported levels (``MAX_LEVELS``, most labelled first) and their rates."""
    kept = sorted(rows, key=lambda row: (-int(row[3]), float(row[0])))[:MAX_LEVELS]
    return {float(level): LiveRate(float(hits) / int(n), int(n)) for level, n, hits, _ in kept}
