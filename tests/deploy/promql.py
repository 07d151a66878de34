"""PromQL expressions read from the committed dashboard and rule files (never copied into the tests), Grafana
variable substitution, and the operands of an alert condition."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import yaml

from tests.deploy.conftest import DASHBOARD, RULES_DIR

# Grafana's built-in interval variables, as a 1 s-scrape test run would see them over its few minutes of traffic
BUILTIN_VARIABLES = {"$__rate_interval": "2m", "$__interval": "15s", "$__range": "5m"}


@dataclass(frozen=True)
class Expression:
    where: str  # "panel 'OOD rate per model' A" or "alert DirectorDown"
    expr: str


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def panels(board: dict[str, Any] | None = None) -> Iterator[dict[str, Any]]:
    """Every panel, those nested in collapsed rows included."""
    for panel in (board or dashboard())["panels"]:
        yield panel
        yield from panel.get("panels", [])


def dashboard_expressions(board: dict[str, Any] | None = None) -> list[Expression]:
    return [Expression(f"panel {p['title']!r} {t['refId']}", t["expr"])
            for p in panels(board) for t in p.get("targets", []) if t.get("expr")]


def variables(board: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    return list((board or dashboard())["templating"]["list"])


def rule_groups() -> list[dict[str, Any]]:
    return [group for path in sorted(RULES_DIR.glob("*.yml")) for group in yaml.safe_load(path.read_text())["groups"]]


def alert_expressions() -> list[Expression]:
    return [Expression(f"alert {r['alert']}", r["expr"]) for g in rule_groups() for r in g["rules"] if "alert" in r]


def recorded_series() -> set[str]:
    return {r["record"] for g in rule_groups() for r in g["rules"] if "record" in r}


def label_values_query(query: str) -> tuple[str, str]:
    """``label_values(metric{...}, label)`` -> (series selector, label)."""
    match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", query.strip())
    assert match, f"unsupported variable query {query!r}"
    return match.group(1), match.group(2)


def substitute(expr: str, values: dict[str, str]) -> str:
    """Replace ``$name`` / ``${name}`` (dashboard variables and Grafana built-ins); fail on any left over."""
    for name, value in sorted({**BUILTIN_VARIABLES, **values}.items(), key=lambda kv: -len(kv[0])):
        bare = name.removeprefix("$")
        expr = expr.replace("${" + bare + "}", value).replace("$" + bare, value)
    assert "$" not in expr, f"unsubstituted variable in {expr!r}"
    return expr


_SET_OPERATORS = ("unless", "and", "or")
_COMPARISONS = ("==", "!=", ">=", "<=", ">", "<")
_MODIFIER = re.compile(r"\s*(bool\b)?\s*((on|ignoring)\s*\([^)]*\))?\s*((group_left|group_right)\s*(\([^)]*\))?)?",
                       re.S)


def operands(expr: str) -> list[str]:
    """The operands of the top-level comparison and set operators of ``expr`` (``A > B and C > D`` ->
    [A, B, C, D]), with their ``on(...)``/``group_left`` modifiers dropped. An alert's condition compares a
    measured quantity with a threshold: each side must have data for the alert to be able to fire."""
    parts: list[str] = []
    depth = 0
    quote = ""
    start = i = 0
    while i < len(expr):
        ch = expr[i]
        if quote:
            quote = "" if ch == quote and expr[i - 1] != "\\" else quote
        elif ch in "\"'`":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif depth == 0:
            op = next((o for o in _COMPARISONS if expr.startswith(o, i)), None)
            if op is None:
                op = next((o for o in _SET_OPERATORS if re.match(rf"(?<![\w:]){o}(?![\w:])", expr[i:])
                           and (i == 0 or not (expr[i - 1].isalnum() or expr[i - 1] in "_:"))), None)
            if op is not None:
                parts.append(expr[start:i])
                i += len(op)
                i += _MODIFIER.match(expr, i).end() - i  # type: ignore[union-attr]
                start = i
                continue
        i += 1
    parts.append(expr[start:])
    return [p.strip() for p in parts if p.strip()]


def is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
