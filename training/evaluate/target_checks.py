"""One checked target as the targets page shows it: the target, DIRECTOR's figure, the reference, the verdict."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SERVED_ROWS = ("director_served", "posthoc_served", "hybrid_served")  # an exported version's row, as it serves


@dataclass
class Check:
    target: str
    director: str
    reference: str
    met: bool | None  # None: not measured

    def row(self) -> str:
        verdict = {True: "met", False: "**missed**", None: "not measured"}[self.met]
        return f"| {self.target} | {self.director} | {self.reference} | {verdict} |"


def at_least(value: float, bound: float) -> bool:
    """``value >= bound`` up to float rounding (an accuracy exactly at its margin meets it)."""
    return value >= bound - 1e-9


def pct(value: float) -> str:
    return f"{100 * value:.2f}%"


def table(checks: list[Check]) -> list[str]:
    return ["| target | DIRECTOR | reference | |", "| --- | --- | --- | --- |", *[c.row() for c in checks]]


def served_key(results: dict[str, Any], samples: int) -> str:
    """The row the targets hold to: the served version's, else DIRECTOR at the default S."""
    return next((k for k in SERVED_ROWS if k in results["test_and_ood"]), f"director_s{samples}")
