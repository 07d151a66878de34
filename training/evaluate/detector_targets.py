"""DIRECTOR against the free detectors and under shift: the targets the detectors and sampling pages answer.

Read from what the evaluation wrote (nothing is measured here): ``docs/results/<task>-detectors.json`` (the
``detectors`` stage: the served score against MDS, RMDS, KNN and ViM on the same backbone's features, with paired
intervals) and, where it exists, ``docs/results/<task>-sampling.json`` (the ``shift`` stage with the shift-fitted noise
beside temperature scaling). ``training.evaluate.targets`` puts these rows on the targets page.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from artifact.contract import parse_manifest, read_document
from artifact.samples import samples_verdict
from training.evaluate.target_checks import Check, at_least, pct, served_key

FEATURE_DETECTORS = ("mds", "rmds", "knn", "vim")


@dataclass(frozen=True)
class DetectorTargets:
    detectors_task: str  # docs/results/<task>.json with a ``detectors`` stage
    sampling_task: str | None  # docs/results/<task>.json with the shift-fitted noise in its ``shift`` stage
    model: str
    version: int
    samples: int  # S of the MI row (the evaluation's S)


# the served defaults' pages (each evaluated with ``evaluate.served_version``, which names the version checked)
DETECTOR_TARGETS = (
    DetectorTargets("fashion-mnist-served", "fashion-mnist-served", "fashion-vit", 9, 16),
    DetectorTargets("movie-reviews-detectors", "movie-reviews-detectors", "movie-reviews-minilm", 9, 16),
    DetectorTargets("writing-source", None, "writing-source-minilm", 3, 16),
)


def detector_checks(results: dict[str, Any]) -> list[Check]:
    """Per reported OOD set: the served score's AUROC against the best feature detector on the backbone (met when the
    paired interval of served minus detector does not lie below 0) and its FPR95 against that detector's."""
    served = results["detectors"]["served_score_auroc"]
    backbone = results["detectors"]["methods"]["deterministic"]["ood"]
    label = results["test_and_ood"][results["detectors"].get("served_method", "director_s1")]["ood_score"]
    checks = []
    for set_name, mine in served.items():
        name = max(FEATURE_DETECTORS, key=lambda d: backbone[set_name][d]["auroc"])
        best = backbone[set_name][name]
        low, high = best["served_minus_detector"]["ci95"]
        checks.append(Check(f"OOD AUROC on {set_name} >= the best feature detector's on the backbone",
                            f"{mine['auroc']:.3f} ({label})",
                            f"{best['auroc']:.3f} ({name}; served minus it [{low:+.3f}, {high:+.3f}])",
                            high >= 0))
        checks.append(Check(f"FPR95 on {set_name} <= that detector's", f"{mine['fpr95']:.3f}",
                            f"{best['fpr95']:.3f} ({name})", at_least(best["fpr95"], mine["fpr95"])))
    return checks


def mutual_information_checks(results: dict[str, Any], key: str, label: str) -> list[Check]:
    """Mutual information's AUROC against the energy score's, both from DIRECTOR row ``key``'s own samples, on every
    reported set."""
    row = results["test_and_ood"].get(key)
    if row is None:
        return [Check(f"MI AUROC ({label}) >= energy's", "-", "-", None)]
    checks = []
    for set_name, scores in row["ood"].items():
        if "mutual_information" not in scores:
            continue
        mine, energy = scores["mutual_information"]["auroc"], scores["energy"]["auroc"]
        checks.append(Check(f"MI AUROC on {set_name} ({label}) >= energy's", f"{mine:.3f}", f"{energy:.3f}",
                            at_least(mine, energy)))
    return checks


def models_note_check(repository: Path, spec: DetectorTargets) -> Check:
    """The accepted alternative to MI beating energy: the version's own note (``GET /models``' ``samples_note``, from
    ``artifact.samples``) says plainly that the samples' disagreement is not its OOD score."""
    folder = repository / spec.model / str(spec.version)
    if not folder.is_dir():
        return Check("or: GET /models says MI is not this version's OOD signal", "-", "-", None)
    note = samples_verdict(parse_manifest(read_document(folder))).note
    says = "mutual_information" in note and any(phrase in note for phrase in (
        "is not its OOD score", "weaker OOD signal", "mutual_information is 0"))
    shown = next((part.strip() for part in note.split(";") if "mutual_information" in part), note)
    return Check("or: GET /models says MI is not this version's OOD signal", f"\"{shown}\"", "samples_note", says)


def shift_ece_checks(results: dict[str, Any], key: str, label: str) -> list[Check]:
    """ECE of method ``key`` against temperature scaling's on every shifted level (images: per severity over the
    corruption types; texts: the mean over the domains)."""
    shift = results.get("shift", {})
    if key not in shift:
        return [Check(f"{label}: ECE under shift <= temperature scaling's", "-", "-", None)]
    mine, ts = shift[key], shift["temperature_scaling"]
    paired = mine.get("paired_vs_temperature_scaling", {})
    if "by_severity" in mine:
        levels = {s: (f"severity {s}", mine["by_severity"][s], ts["by_severity"][s])
                  for s in sorted(mine["by_severity"], key=int)}
    else:  # texts: every domain, then their mean (the paired interval is the mean's)
        levels = {d: (d, mine["by_domain"][d], ts["by_domain"][d]) for d in mine["by_domain"]}
        levels["mean"] = ("the domains' mean", mine["mean"], ts["mean"])
    checks = []
    for key_, (level, m, t) in levels.items():
        interval = ""
        if key_ in paired:  # the pooled paired difference, in points
            low, high = (100 * v for v in paired[key_]["ece"]["ci95"])
            interval = f" (pooled minus TS {100 * paired[key_]['ece']['difference']:+.2f} [{low:+.2f}, {high:+.2f}])"
        checks.append(Check(f"{label}: ECE under shift, {level} <= temperature scaling's", pct(m["ece"]) + interval,
                            pct(t["ece"]), at_least(t["ece"], m["ece"])))
    return checks


COST_BASELINE = "3"  # the version whose served inference the chosen score's cost is compared with
MAX_COST_RATIO = 1.2


def cost_checks(costs: dict[str, Any], spec: DetectorTargets) -> list[Check]:
    """The version's served inference at S = 1 against version 3's, per batch size, from
    ``benchmarks/version_cost.py`` (the median of the paired round ratios); none when that model was not measured."""
    entry = costs.get(spec.model)
    version = str(spec.version)
    if not entry or next(iter(entry["versions"])) != COST_BASELINE or version not in entry.get("summary", {}):
        return []  # not measured, or its ratios are to another version
    checks = []
    for batch, row in entry["summary"][version].items():
        ratio, base = row["vs_first"], entry["summary"][COST_BASELINE][batch]["ms_per_batch"]["median"]
        checks.append(Check(f"served inference at S = {entry['n_samples']}, {batch} input(s) per batch, <= "
                            f"{MAX_COST_RATIO:g}x version {COST_BASELINE}'s",
                            f"{ratio['median']:.2f}x [{ratio['min']:.2f}, {ratio['max']:.2f}]",
                            f"{base:.2f} ms (v{COST_BASELINE})", ratio["median"] <= MAX_COST_RATIO))
    return checks


def detector_sections(results_dir: Path, cost_file: Path | None = None, repository: Path = Path("model_repository")
                      ) -> list[tuple[str, str, list[Check]]]:
    """(title, source line, checks) for each task whose detectors page exists; ``cost_file`` (the version-cost
    benchmark's JSON, by default ``docs/benchmarks-version-cost.json`` beside the results folder) adds the cost rows,
    ``repository`` the version's own note on MI when MI misses a set."""
    cost_file = cost_file or results_dir.parent / "benchmarks-version-cost.json"
    costs = json.loads(cost_file.read_text()) if cost_file.exists() else {}
    sections = []
    for spec in DETECTOR_TARGETS:
        path = results_dir / f"{spec.detectors_task}.json"
        if not path.exists():
            continue
        results = json.loads(path.read_text())
        if "detectors" not in results:  # the page ran without its detectors stage
            continue
        # the version the page evaluated as served, when it names one (else the spec's)
        spec = dataclasses.replace(spec, version=int((results.get("served") or {}).get("version", spec.version)))
        checks = detector_checks(results)
        sources = [f"[`{spec.detectors_task}.md`]({spec.detectors_task}.md) (commit {results.get('git_commit', '?')})"]
        sampling = results_dir / f"{spec.sampling_task}.json" if spec.sampling_task else None
        shifted = json.loads(sampling.read_text()) if sampling is not None and sampling.exists() else None
        served = (shifted or {}).get("served")
        if served and served["default_samples"] > 1:  # MI as a user of the served version reads it
            label = f"as served, v{served['version']} S={served['default_samples']}"
            checks += mutual_information_checks(shifted or {}, "director_served", label)
        else:
            checks += mutual_information_checks(results, f"director_s{spec.samples}", f"S = {spec.samples}")
        if any(c.met is False for c in checks if c.target.startswith("MI AUROC")):
            checks.append(models_note_check(repository, spec))
        if shifted is not None:
            checks += (shift_ece_checks(shifted, served_key(shifted, served["default_samples"]),
                                        f"{'Post-hoc' if served.get('method') == 'posthoc' else 'DIRECTOR'} as served "
                                        f"(v{served['version']}, S={served['default_samples']})")
                       if served else shift_ece_checks(shifted, "director_s1", "DIRECTOR (S=1, served)"))
            samples = shifted["settings"]["samples"]
            checks += shift_ece_checks(shifted, f"director_s{samples}_shift_noise",
                                       f"DIRECTOR (S={samples}) + shift-fitted noise")
            if spec.sampling_task != spec.detectors_task:
                sources.append(f"[`{spec.sampling_task}.md`]({spec.sampling_task}.md) "
                               f"(commit {shifted.get('git_commit', '?')})")
        cost = cost_checks(costs, spec)
        if cost:
            checks += cost
            measured = costs[spec.model]["date"]
            sources.append(f"[`benchmarks-version-cost.md`](../benchmarks-version-cost.md) ({measured})")
        sections.append((f"{spec.model} version {spec.version} against the free detectors and under shift",
                         "From " + " and ".join(sources), checks))
    return sections
