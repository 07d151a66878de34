"""The method paper's headline claim, checked on the page's own figures: DIRECTOR more accurate and better calibrated
than KEP-SVGP (docs/method.md, "Baselines: KEP-SVGP"). Written from the paired differences the evaluation measured,
so a rerun writes the same verdict from the same numbers."""

from __future__ import annotations

from typing import Any

BASELINE = "kep_svgp"


def verdict(accuracy: dict[str, Any], ece: dict[str, Any]) -> str:
    """How the paired intervals of DIRECTOR minus KEP-SVGP (accuracy, ECE) answer the claim."""
    acc_low, acc_high = accuracy["ci95"]
    ece_low, ece_high = ece["ci95"]
    if acc_high < 0 or ece_low > 0:
        return "does not hold on this task: an interval excludes 0 on KEP-SVGP's side"
    if acc_low > 0 and ece_high < 0:
        return "holds on this task: both intervals exclude 0 on DIRECTOR's side"
    if accuracy["difference"] > 0 and ece["difference"] < 0:
        resolved = [name for name, ok in (("accuracy", acc_low > 0), ("ECE", ece_high < 0)) if ok]
        return ("holds in its point estimates; this split resolves " + (" and ".join(resolved) or "neither")
                + ", the other interval reaches 0")
    return "is not resolved by this split: the point estimates do not both favour DIRECTOR"


def claim_section(results: dict[str, Any]) -> list[str]:
    """The claim's verdict at the evaluation's S and at S = 1, when the evaluation has a KEP-SVGP row."""
    methods = results["test_and_ood"]
    if BASELINE not in methods:
        return []
    samples = results["settings"]["samples"]
    rows = [f"director_s{samples}", "director_s1"]
    lines = ["### The method paper's claim on this task", "",
             f"The method paper reports DIRECTOR more accurate and better calibrated than KEP-SVGP. Paired on the same "
             f"test inputs against {methods[BASELINE]['label']}:", ""]
    for key in rows:
        paired = results.get("paired", {}).get(f"{key} - {BASELINE}")
        if paired is None:
            continue
        acc, ece, nll = paired["accuracy"], paired["ece"], paired["nll"]
        lines.append(f"- {methods[key]['label']}: accuracy {100 * acc['difference']:+.2f} points "
                     f"[{100 * acc['ci95'][0]:+.2f}, {100 * acc['ci95'][1]:+.2f}], ECE {100 * ece['difference']:+.2f} "
                     f"points [{100 * ece['ci95'][0]:+.2f}, {100 * ece['ci95'][1]:+.2f}], NLL {nll['difference']:+.4f} "
                     f"[{nll['ci95'][0]:+.4f}, {nll['ci95'][1]:+.4f}]: the claim {verdict(acc, ece)}.")
    return [*lines, ""]
