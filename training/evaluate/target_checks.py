"""One checked target as the targets page shows it: the target, DIRECTOR's figure, the reference, the verdict."""

from __future__ import annotations

from dataclasses import dataclass


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
