"""The results page's section on prediction sets and abstentions (``training.evaluate.decisions``): coverage and set
size on the test split, under shift and on OOD inputs, the shift-normalised variant beside the plain sets, and the
selective risk at each guaranteed threshold. Every sentence is computed from the numbers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from training.evaluate.page_sections import pct
from training.evaluate.plots import decisions_plot

COVERAGE_TOLERANCE = 0.015  # the test coverage a method should reach within, at 0.9 and 0.95


def cell(figures: dict[str, Any]) -> str:
    """``coverage % (size)``, or the size alone on unlabelled inputs."""
    if "coverage" not in figures:
        return f"{figures['mean_size']:.2f}"
    return f"{pct(figures['coverage'])} ({figures['mean_size']:.2f})"


def test_table(section: dict[str, Any]) -> list[str]:
    levels = [f"{c:g}" for c in section["coverages"]]
    head = " | ".join(f"{float(c):.0%} target: coverage % (mean size)" for c in levels)
    lines = [f"| method | score | {head} |",
             "| --- | --- |" + " --- |" * len(levels)]
    for entry in section["methods"].values():
        for score, by_level in entry["test"]["sets"].items():
            lines.append(f"| {entry['label']} | {score} | " + " | ".join(cell(by_level[c]) for c in levels) + " |")
    return lines


def coverage_sentences(section: dict[str, Any]) -> list[str]:
    """Which methods reach the target coverage within ``COVERAGE_TOLERANCE`` at 0.9 and 0.95 with the default score,
    and which keep the selective risk at or below each max_risk."""
    score = section["default_score"]
    off, over = [], []
    for entry in section["methods"].values():
        for level in ("0.9", "0.95"):
            got = entry["test"]["sets"][score][level]["coverage"]
            if abs(got - float(level)) > COVERAGE_TOLERANCE:
                off.append(f"{entry['label']} at {level} ({pct(got)} %)")
        for risk, figures in entry["test"]["selective"].items():
            if figures["risk"] is not None and figures["risk"] > float(risk):
                over.append(f"{entry['label']} at max_risk {risk} ({pct(figures['risk'])} %)")
    said = [f"On the test split, every method's {score} sets cover within {COVERAGE_TOLERANCE * 100:g} points of 90% "
            "and 95%." if not off else f"Coverage further than {COVERAGE_TOLERANCE * 100:g} points from its target "
            f"({score}): {'; '.join(off)}."]
    said.append("Every guaranteed threshold keeps the test split's error rate among answered inputs at or below its "
                "max_risk." if not over else f"Selective risk above max_risk on the test split: {'; '.join(over)}.")
    return [" ".join(said)]


def shift_table(section: dict[str, Any], level: str) -> list[str]:
    """Per shift level: coverage (mean size) at ``level`` with the default score, plain and shift-normalised."""
    methods = section["methods"]
    first = next(iter(methods.values()))
    lines = ["| shift | " + " | ".join(f"{e['label']} | normalised (gamma {e['variant']['gamma']:g})"
                                      for e in methods.values()) + " |",
             "| --- |" + " --- |" * (2 * len(methods))]
    for name in first["shift"]:
        cells = [f"{cell(e['shift'][name]['sets'][level])} | {cell(e['shift'][name]['sets_normalised'][level])}"
                 for e in methods.values()]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def ood_table(section: dict[str, Any]) -> list[str]:
    methods = section["methods"]
    score = section["default_score"]
    sets = list(next(iter(methods.values()))["ood"])
    lines = ["| method | " + " | ".join(f"{s}: size at 90% / 99%" for s in sets) + " |",
             "| --- |" + " --- |" * len(sets)]
    for entry in methods.values():
        cells = [f"{entry['ood'][s][score]['0.9']['mean_size']:.2f} / {entry['ood'][s][score]['0.99']['mean_size']:.2f}"
                 for s in sets]
        lines.append(f"| {entry['label']} | " + " | ".join(cells) + " |")
    return lines


def selective_table(section: dict[str, Any]) -> list[str]:
    """Per method and max_risk: the threshold, and the test split's share answered and risk among answered; then the
    same risk on each shift level."""
    risks = [f"{r:g}" for r in section["risks"]]
    first = next(iter(section["methods"].values()))
    levels = list(first["shift"])
    lines = ["| method | max_risk | confidence threshold | answered % | risk % | "
             + " | ".join(f"risk % ({level})" for level in levels) + " |",
             "| --- | --- | --- | --- | --- |" + " --- |" * len(levels)]
    for entry in section["methods"].values():
        for risk in risks:
            test = entry["test"]["selective"][risk]
            shift = [entry["shift"][level]["selective"][risk]["risk"] for level in levels]
            lines.append(f"| {entry['label']} | {risk} | "
                         + ("none: every input abstains" if test["threshold"] is None else f"{test['threshold']:.4f}")
                         + f" | {pct(test['answered'])} | {pct(test['risk']) if test['risk'] is not None else '-'} | "
                         + " | ".join(pct(r) if r is not None else "-" for r in shift) + " |")
    return lines


def decisions_section(results: dict[str, Any], out_dir: Path) -> list[str]:
    section = results["decisions"]
    plot = decisions_plot(section, out_dir / f"{results['task']}-decisions.png")
    return [
        "## Prediction sets and abstentions", "",
        f"Calibrated on the export's calibration split ({section['calibration_inputs']:,} validation inputs that no "
        "other fit sees), as a version serves them (docs/method.md, \"Acting on uncertainty\"). Coverage is the share "
        "of inputs whose set holds the true label; its guarantee is marginal and needs inputs exchangeable with the "
        "calibration split, so it is expected to hold on the test split and to drop under shift.", "",
        "### Test split", "", *test_table(section), "", *coverage_sentences(section), "",
        f"### Under shift ({section['default_score']}, 90% target)", "",
        "The normalised variant divides every score by exp(gamma * z), z the input's OOD score standardised on the "
        f"calibration split and clipped at 0; gamma is chosen on {section['held_out_shift']} (the smallest that "
        "reaches 90% there), never on a reported set.", "",
        *shift_table(section, "0.9"), "",
        "### On OOD inputs: mean set size", "", *ood_table(section), "",
        f"### Abstentions: Learn then Test, delta {section['delta']:g}", "", *selective_table(section), "",
        f"![risk against share answered, and coverage under shift]({plot.name})", "",
    ]
