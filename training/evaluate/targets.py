"""DIRECTOR's targets (accuracy, calibration, shift, OOD, cost) checked against the pipeline's own results:
``python -m training.evaluate.targets``.

Reads what `make evaluate` / `make text-evaluate` wrote (``docs/results/<task>.json``), the served artifact's manifest
(its default sample count S) and the serving benchmark's budget run (``docs/benchmarks.json``), and writes
``docs/results/targets.md``: every target with DIRECTOR's figure, the reference it is held against and whether it is
met. Nothing is measured here; a target whose result is missing is reported as not measured.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from training.evaluate.detector_targets import detector_sections
from training.evaluate.target_checks import Check, at_least, pct, served_key, table

RESULTS = Path("docs/results")
REPOSITORY = Path("model_repository")
BENCHMARK = Path("docs/benchmarks.json")
DETERMINISTIC = "deterministic"
BASELINES = ("deterministic", "temperature_scaling", "mc_dropout", "ensemble")


@dataclass(frozen=True)
class TaskTargets:
    task: str  # docs/results/<task>.json
    model: str  # the served DIRECTOR: model_repository/<model>/<version>/
    version: int
    make: str  # the command that writes the task's results
    accuracy_margin: float  # accuracy >= the backbone's - margin (a fraction)
    shift_margin: float  # accuracy under shift >= the backbone's - margin: every severity (images), the mean (texts)
    ood_reference: str  # "best baseline" (the best AUROC of BASELINES on each set) or "backbone"
    ece_at_most_temperature_scaling: bool
    latency_ratio: float = 3.0  # the default S at <= this times the backbone's latency
    budget_ratio: float | None = None  # S=16 under the p99 budget >= this times the deterministic model's rate


# the version whose run the task's evaluation measured (its manifest gives the default S), unless the evaluation
# measured an exported version as it serves (``evaluate.served_version``): then that version and its row
# the served defaults first (their pages name the evaluation command at the top), then the methods pages of ``make``
ON_THE_PAGE = "the command at the top of the page"
TARGETS = (
    TaskTargets("fashion-mnist-served", "fashion-vit", 9, ON_THE_PAGE, 0.003, 0.005, "best baseline", False, 3.0, 0.3),
    TaskTargets("movie-reviews-detectors", "movie-reviews-minilm", 9, ON_THE_PAGE, 0.005, 0.01, "backbone", True),
    TaskTargets("writing-source", "writing-source-minilm", 3, ON_THE_PAGE, 0.005, 0.01, "backbone", True),
    TaskTargets("fashion-mnist", "fashion-vit", 3, "make evaluate", 0.003, 0.005, "best baseline", False, 3.0, 0.3),
    TaskTargets("movie-reviews", "movie-reviews-minilm", 3, "make text-evaluate", 0.005, 0.01, "backbone", True),
)


def served_version(spec: TaskTargets, results: dict[str, Any]) -> int:
    return int((results.get("served") or {}).get("version", spec.version))


def default_samples(spec: TaskTargets, results: dict[str, Any], repository: Path) -> int:
    version = served_version(spec, results)
    manifest = json.loads((repository / spec.model / str(version) / "manifest.json").read_text())
    return int(manifest["sampling"]["default_samples"])


def kernel_checks(results: dict[str, Any], key: str) -> list[Check]:
    """A version that serves the post-hoc path, against DIRECTOR at S = 1 on the same run (``kernel_ablation``): on
    the test split, every shift level and every reported OOD set, no figure where DIRECTOR is better beyond noise
    (the post-hoc path within DIRECTOR's paired interval)."""
    rows = (results.get("kernel_ablation") or {}).get("rows", {})
    if key != "posthoc_served" or "director_s1" not in rows:
        return []
    row = rows["director_s1"]
    cells = [(f"{m} on the test split", m, row["test"][m]) for m in ("accuracy", "ece", "nll")]
    cells += [(f"{m} at {'the shifted domains' if level == 'mean' else 'severity ' + level}", m, d[m])
              for level, d in row["shift"].items() for m in ("ece", "nll")]
    cells += [(f"OOD AUROC on {name}", "auroc", d["auroc"]) for name, d in row["ood"].items()]
    checks = []
    for where, metric, d in cells:
        low, high = d["ci95"]
        director_better = high < 0 if metric in ("ece", "nll") else low > 0
        checks.append(Check(f"{where}: the post-hoc path within DIRECTOR's paired interval",
                            f"DIRECTOR minus it {d['difference']:+.4f}", f"[{low:+.4f}, {high:+.4f}]",
                            not director_better))
    return checks


def shift_ece_check(results: dict[str, Any], key: str) -> list[Check]:
    """The shifted domains' mean ECE against temperature scaling's (texts)."""
    shift = results.get("shift", {})
    if key not in shift or "mean" not in shift[key]:
        return []
    mine, ts = shift[key]["mean"]["ece"], shift["temperature_scaling"]["mean"]["ece"]
    return [Check("mean shifted-domain ECE <= temperature scaling's", pct(mine), pct(ts), at_least(ts, mine))]


def ood_checks(results: dict[str, Any], key: str, spec: TaskTargets) -> list[Check]:
    """DIRECTOR's AUROC (its own chosen score) against the reference's on every reported OOD set."""
    methods = results["test_and_ood"]
    own = methods[key]
    references = BASELINES if spec.ood_reference == "best baseline" else (DETERMINISTIC,)
    checks = []
    for set_name, scores in own["ood"].items():
        mine = scores[own["ood_score"]]["auroc"]
        best = max(references, key=lambda m: methods[m]["ood"][set_name][methods[m]["ood_score"]]["auroc"])
        theirs = methods[best]["ood"][set_name][methods[best]["ood_score"]]["auroc"]
        checks.append(Check(f"OOD AUROC on {set_name} >= the {spec.ood_reference}'s",
                            f"{mine:.3f} ({own['ood_score']})",
                            f"{theirs:.3f} ({methods[best]['label']}, {methods[best]['ood_score']})",
                            at_least(mine, theirs)))
    return checks


def shift_checks(results: dict[str, Any], key: str, spec: TaskTargets) -> list[Check]:
    shift = results.get("shift")
    if not shift or key not in shift:
        return [Check("accuracy under shift", "-", "-", None)]
    mine, base = shift[key], shift[DETERMINISTIC]
    margin = f"- {100 * spec.shift_margin:.1f} point"
    if "by_severity" in mine:
        return [Check(f"accuracy under corruption, severity {sev} >= the backbone's {margin}",
                      pct(mine["by_severity"][sev]["accuracy"]), pct(base["by_severity"][sev]["accuracy"]),
                      at_least(mine["by_severity"][sev]["accuracy"],
                               base["by_severity"][sev]["accuracy"] - spec.shift_margin))
                for sev in sorted(mine["by_severity"], key=int)]
    return [Check(f"mean shifted-domain accuracy >= the backbone's {margin}", pct(mine["mean"]["accuracy"]),
                  pct(base["mean"]["accuracy"]),
                  at_least(mine["mean"]["accuracy"], base["mean"]["accuracy"] - spec.shift_margin))]


def budget_check(benchmark: dict[str, Any] | None, spec: TaskTargets) -> list[Check]:
    if spec.budget_ratio is None:
        return []
    target = f"S = 16 under a 50 ms p99 >= {spec.budget_ratio}x the deterministic model's requests per second"
    budget = (benchmark or {}).get("budget", {})
    summary = {(r["label"], r["n_samples"]): r for r in budget.get("repeated", []) if r["batching"] == "batching"}
    mine, plain = summary.get(("DIRECTOR", 16)), summary.get(("deterministic", 1))
    if mine and plain and mine["vs_deterministic"] and plain["max_rps"]:  # repeated searches: medians, paired ratio
        ratio = mine["vs_deterministic"]["median"]
        served = f"version {budget['director_version']}, " if "director_version" in budget else ""
        return [Check(target, f"{mine['max_rps']['median']:.1f} rps ({ratio:.2f}x; {served}median of "
                      f"{mine['repeats']} repeats, ratio paired by repeat)", f"{plain['max_rps']['median']:.1f} rps",
                      at_least(ratio, spec.budget_ratio))]
    rows = budget.get("rows", [])
    rate = {(r["method"], r["n_samples"]): r["max_rps"] for r in rows if r["batching"] == "batching"}
    if ("director", 16) not in rate or (DETERMINISTIC, 1) not in rate:
        return [Check(target, "-", "-", None)]
    ratio = rate[("director", 16)] / rate[(DETERMINISTIC, 1)]
    return [Check(target, f"{rate[('director', 16)]:.1f} rps ({ratio:.2f}x)", f"{rate[(DETERMINISTIC, 1)]:.1f} rps",
                  at_least(ratio, spec.budget_ratio))]


def task_checks(spec: TaskTargets, results: dict[str, Any], samples: int, benchmark: dict[str, Any] | None
                ) -> list[Check]:
    key = served_key(results, samples)
    test = {name: entry["test"] for name, entry in results["test_and_ood"].items()}
    mine, base = test[key], test[DETERMINISTIC]
    checks = [Check(f"accuracy >= the backbone's - {100 * spec.accuracy_margin:.1f} point", pct(mine["accuracy"]),
                    pct(base["accuracy"]), at_least(mine["accuracy"], base["accuracy"] - spec.accuracy_margin))]
    if spec.ece_at_most_temperature_scaling:
        ts = test["temperature_scaling"]
        checks.append(Check("ECE <= temperature scaling's", pct(mine["ece"]), pct(ts["ece"]),
                            at_least(ts["ece"], mine["ece"])))
        checks += shift_ece_check(results, key)
    checks += shift_checks(results, key, spec)
    checks += kernel_checks(results, key)
    checks += ood_checks(results, key, spec)
    cost = results.get("cost", {})
    if key in cost:
        ratio = cost[key]["latency_ms_ratio"]
        checks.append(Check(f"latency at the default S <= {spec.latency_ratio:g}x the backbone's",
                            f"{cost[key]['latency_ms']:.2f} ms ({ratio:.1f}x)",
                            f"{cost[DETERMINISTIC]['latency_ms']:.2f} ms", at_least(spec.latency_ratio, ratio)))
    return checks + budget_check(benchmark, spec)


def render(sections: list[tuple[TaskTargets, int, dict[str, Any], list[Check]]]) -> str:
    lines = ["# DIRECTOR against its targets", "",
             "Written by `python -m training.evaluate.targets` from the evaluation results below "
             "(nothing is measured by it). "
             "DIRECTOR is the served version's row where the evaluation measured it as it serves (a post-hoc "
             "version's row is the path it serves), else DIRECTOR at the artifact's default sample count S; OOD uses "
             "each method's own chosen score (a served version's row, its manifest's).", ""]
    for spec, samples, results, checks in sections:
        missed = sum(c.met is False for c in checks)
        command = spec.make if spec.make == ON_THE_PAGE else f"`{spec.make}`"
        lines += [f"## {spec.model} version {served_version(spec, results)} ({spec.task}, S = {samples})", "",
                  f"From [`{spec.task}.md`]({spec.task}.md) ({command}, commit {results.get('git_commit', '?')}, "
                  f"{results.get('date', '?')}): {len(checks) - missed} of {len(checks)} targets met.", "",
                  *table(checks), ""]
    return "\n".join(lines)


# why a served score can trail a detector on a reported set (``training.posthoc.ood_selection``'s rule)
BELOW_A_DETECTOR = ("Where the served score is below a feature detector on a reported set: the score is chosen on the "
                    "OOD-validation families, never on these sets, by the lowest worst-case regret over the families "
                    "(docs/method.md, \"An OOD score chosen to generalise\"), and that detector's worst case there was "
                    "no better; the interval above says how far behind it is here.")


def render_detectors(sections: list[tuple[str, str, list[Check]]]) -> str:
    lines = []
    for title, source, checks in sections:
        missed = sum(c.met is False for c in checks)
        lines += [f"## {title}", "", f"{source}: {len(checks) - missed} of {len(checks)} targets met.", "",
                  *table(checks), ""]
        if any(c.met is False and c.target.endswith("the best feature detector's on the backbone") for c in checks):
            lines += [BELOW_A_DETECTOR, ""]
    return "\n".join(lines)


def targets_page(results_dir: Path = RESULTS, repository: Path = REPOSITORY, benchmark: Path = BENCHMARK) -> str:
    """The page's text, from the results in ``results_dir``, the manifests and the benchmark file."""
    bench = json.loads(benchmark.read_text()) if benchmark.exists() else None
    sections = []
    for spec in TARGETS:
        path = results_dir / f"{spec.task}.json"
        if not path.exists():  # that task not evaluated here yet
            continue
        results = json.loads(path.read_text())
        samples = default_samples(spec, results, repository)
        sections.append((spec, samples, results, task_checks(spec, results, samples, bench)))
    return render(sections) + "\n" + render_detectors(detector_sections(results_dir, repository=repository))


def write_targets(results_dir: Path = RESULTS, repository: Path = REPOSITORY, benchmark: Path = BENCHMARK) -> Path:
    page = results_dir / "targets.md"
    page.write_text(targets_page(results_dir, repository, benchmark))
    return page


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.evaluate.targets", description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--repository", type=Path, default=REPOSITORY)
    parser.add_argument("--benchmark", type=Path, default=BENCHMARK)
    args = parser.parse_args(argv)
    print(f"wrote {write_targets(args.results, args.repository, args.benchmark)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
