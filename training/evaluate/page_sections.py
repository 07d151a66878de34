"""The methods-compared page's formatting helpers and its later sections (shift, the sweep over sample counts,
ablations), each a list of Markdown lines; ``training.evaluate.page`` assembles the page."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from training.evaluate.plots import domain_shift_plot, shift_plot, sweep_plot


def pct(value: float) -> str:
    return f"{100 * value:.2f}"


def interval(block: dict[str, Any]) -> str:
    low, high = block["ece_ci95"]
    return f"{pct(block['ece'])} [{pct(low)}, {pct(high)}]"


def mib(value: float) -> str:
    return f"{value / 2**20:.1f}"


def flag_table(results: dict[str, Any]) -> list[str]:
    """Per method: the share flagged OOD on the test split and on each shifted group (text domains, or corruption
    severities averaged over the types), with the accuracy of the kept and of the flagged inputs."""
    labels = {k: r["label"] for k, r in results["test_and_ood"].items()}
    first = next(iter(results["shift"].values()))
    groups = "by_domain" if "by_domain" in first else "by_severity"
    names = list(first[groups])

    def cell(entry: dict[str, Any]) -> str:
        flagged = "-" if entry["accuracy_flagged"] is None else pct(entry["accuracy_flagged"])
        kept = "-" if entry["accuracy_kept"] is None else pct(entry["accuracy_kept"])
        return f"{pct(entry['flag_rate'])} / {kept} / {flagged}"

    heading = "domain" if groups == "by_domain" else "severity"
    lines = ["Each method's own OOD flag (its chosen score above, at the threshold that passes 95% of validation "
             "inputs): the share flagged, then the accuracy of the kept and of the flagged inputs (`-`: none). A flag "
             "that separates errors keeps the accurate inputs and sends the inaccurate ones to review.", "",
             "| method | test: flagged | " + " | ".join(f"{heading} {n}: flagged / acc kept / acc flagged"
                                                       for n in names) + " |",
             "| --- | --- | " + " | ".join("---" for _ in names) + " |"]
    for key, r in results["shift"].items():
        test_rate = results["test_and_ood"][key].get("test_flag_rate")
        cells = [cell(r[groups][n]) for n in names]
        lines.append(f"| {labels[key]} | {'-' if test_rate is None else pct(test_rate)} | " + " | ".join(cells) + " |")
    return lines


def shift_table(results: dict[str, Any]) -> list[str]:
    labels = {k: r["label"] for k, r in results["test_and_ood"].items()}
    severities = sorted(next(iter(results["shift"].values()))["by_severity"], key=int)
    lines = ["| method | " + " | ".join(f"sev {s}: acc / ECE / NLL" for s in severities) + " |",
             "| --- | " + " | ".join("---" for _ in severities) + " |"]
    for key, r in results["shift"].items():
        cells = [f"{pct(r['by_severity'][s]['accuracy'])} / {pct(r['by_severity'][s]['ece'])} / "
                 f"{r['by_severity'][s]['nll']:.3f}" for s in severities]
        lines.append(f"| {labels[key]} | " + " | ".join(cells) + " |")
    return lines


def sweep_table(results: dict[str, Any]) -> list[str]:
    sweep = results["sweep"]
    counts = sorted(next(iter(sweep.values())), key=int)
    lines = ["| S | DIRECTOR acc % / ECE % / NLL / ms | MC dropout acc % / ECE % / NLL / ms |", "| --- | --- | --- |"]
    for s in counts:
        cells = [f"{pct(sweep[src][s]['accuracy'])} / {pct(sweep[src][s]['ece'])} / {sweep[src][s]['nll']:.4f} / "
                 f"{sweep[src][s]['latency_ms']:.2f}" for src in ("director", "mc_dropout")]
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    return lines


def domain_shift_table(results: dict[str, Any]) -> list[str]:
    labels = {k: r["label"] for k, r in results["test_and_ood"].items()}
    first = next(iter(results["shift"].values()))
    domains = list(first["by_domain"])
    lines = ["| method | " + " | ".join(f"{d} (n={first['by_domain'][d]['n']:,}): acc / ECE / NLL" for d in domains)
             + " | mean: acc / ECE / NLL |",
             "| --- | " + " | ".join("---" for _ in domains) + " | --- |"]
    for key, r in results["shift"].items():
        cells = [f"{pct(e['accuracy'])} / {pct(e['ece'])} / {e['nll']:.3f}"
                 for e in [*(r["by_domain"][d] for d in domains), r["mean"]]]
        lines.append(f"| {labels[key]} | " + " | ".join(cells) + " |")
    return lines


def shifted(result: dict[str, Any]) -> tuple[str, dict[str, float]]:
    """The hardest shift a method's shift result holds: the top severity, or the mean over text domains."""
    if "by_domain" in result:
        return "on the shifted domains (mean)", result["mean"]
    sev = max(result["by_severity"], key=int)
    return f"at severity {sev}", result["by_severity"][sev]


def auroc_cell(entry: dict[str, Any], key: str) -> str:
    """An AUROC of the ablation table; ``-`` where the evaluation that wrote it did not measure it."""
    return f"{entry[key]:.3f}" if key in entry else "-"


def ablation_table(results: dict[str, Any]) -> list[str]:
    ab = results["ablations"]
    if not ab["ablation"] and not ab["seed"]:
        return ["Not run in this evaluation (`evaluate.ablations` and `evaluate.distil_seeds` were empty)."]
    sets = [k.removeprefix("mi_") for k in next(iter({**ab["ablation"], **ab["seed"]}.values())) if k.startswith("mi_")]
    samples = results["settings"]["samples"]
    scores = {"mi": "MI", "max_softmax": "max-softmax", "energy": "energy"}
    head = (f"| variant | depth K | observed variance | tau | epochs | acc % (S={samples}) | acc % (S=1) | ECE % | NLL "
            "| mean MI test | " + " | ".join(f"{label} AUROC {s}" for label in scores.values() for s in sets) + " |")
    lines = [head, "| " + " | ".join("---" for _ in range(10 + len(scores) * len(sets))) + " |"]
    for group in ("ablation", "seed"):
        for name, e in ab[group].items():
            lines.append(f"| {name} | {e.get('depth') or '-'} | {e['observed_variance']} | {e['tau']} | {e['epochs']} "
                         f"| {pct(e['accuracy'])} | "
                         f"{pct(e['accuracy_s1'])} | {pct(e['ece'])} | {e['nll']:.4f} | "
                         f"{e['mean_mutual_information']:.2e} | "
                         + " | ".join(auroc_cell(e, f"auroc_{score}_{s}") for score in scores for s in sets) + " |")
    ms = ab.get("seed_mean_std")
    if ms is None:
        return lines
    if len(ab["seed"]) < 2:
        return [*lines, "", "Distillation seeds: only the main run so far, so no spread yet; the extra seeds of "
                "`evaluate.distil_seeds` train (full recipe, cached) when that list is non-empty."]
    lines += ["", f"Distillation seeds ({len(ab['seed'])} runs, full recipe): accuracy "
                  f"{pct(ms['accuracy']['mean'])} +- {pct(ms['accuracy']['std'])} %, ECE {pct(ms['ece']['mean'])} "
                  f"+- {pct(ms['ece']['std'])} %, NLL {ms['nll']['mean']:.4f} +- {ms['nll']['std']:.4f}, S=1 accuracy "
                  f"{pct(ms['accuracy_s1']['mean'])} +- {pct(ms['accuracy_s1']['std'])} %, mean MI "
                  f"{ms['mean_mutual_information']['mean']:.2e} +- {ms['mean_mutual_information']['std']:.2e} nats."]
    return lines


PENDING = ("Not run: this stage is not in this run's `evaluate.stages` (the config's list, or `--set` on the "
           "command line); add it there to fill this section.")




def _shift_cut(settings: dict[str, Any]) -> str:
    n = settings.get("shift_texts")
    return f"; each domain cut to {n:,} sentences drawn under the seed" if n else ""


def paired_shift_section(results: dict[str, Any]) -> list[str]:
    """Each DIRECTOR method minus temperature scaling under shift, pooled per level, with paired intervals (nothing
    when the evaluation has no temperature-scaling row)."""
    labels = {k: r["label"] for k, r in results["test_and_ood"].items()}
    rows = {k: r["paired_vs_temperature_scaling"] for k, r in results["shift"].items()
            if "paired_vs_temperature_scaling" in r}
    if not rows:
        return []
    levels = list(next(iter(rows.values())))
    name = {"mean": "the domains pooled"}
    lines = ["### Against temperature scaling under shift, paired", "",
             "Each DIRECTOR row minus temperature scaling on the same shifted inputs, pooled over the "
             f"{'domains' if 'mean' in levels else 'corruption types'} of each level (one ECE over all of them, so it "
             "differs from the mean of the per-type ECEs above); 95% intervals from "
             f"{results['settings']['bootstrap']} paired bootstrap resamples.", "",
             "| method | " + " | ".join(f"{name.get(lv, f'sev {lv}')}: ECE (points) / NLL" for lv in levels) + " |",
             "| --- | " + " | ".join("---" for _ in levels) + " |"]
    for key, by_level in rows.items():
        cells = [f"{100 * d['ece']['difference']:+.2f} [{100 * d['ece']['ci95'][0]:+.2f}, "
                 f"{100 * d['ece']['ci95'][1]:+.2f}] / {d['nll']['difference']:+.3f} [{d['nll']['ci95'][0]:+.3f}, "
                 f"{d['nll']['ci95'][1]:+.3f}]" for d in by_level.values()]
        lines.append(f"| {labels[key]} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def shift_section(results: dict[str, Any], labels_by_key: dict[str, str], out_dir: Path) -> list[str]:
    """Shifted domains (texts) or corrupted images, with each method's flags under shift."""
    task, st = results["task"], results["settings"]
    if "shift" not in results:
        return ["## Shift", "", PENDING, ""]
    if "by_domain" in next(iter(results["shift"].values())):
        shift = domain_shift_plot(results["shift"], labels_by_key, out_dir / f"{task}-shift.png")
        return ["## Shift: other domains of the same corpus", "",
                "Sentences from other sources, labelled by the same rule as the training data (mean human rating "
                f"above +0.5 positive, below -0.5 negative){_shift_cut(st)}.", "",
                *domain_shift_table(results), "", f"![shift]({shift.name})", "",
                *paired_shift_section(results), "### Flags by domain", "", *flag_table(results), ""]
    lines = [f"## Shift: corrupted test images ({st['corruption_images']} per type and severity, mean over the "
             "types)", ""]
    shift = shift_plot(results["shift"], labels_by_key, out_dir / f"{task}-shift.png")
    return lines + ["Types: " + ", ".join(next(iter(results["shift"].values()))["by_type"]) + ". Per type in the "
                    "JSON.", "", *shift_table(results), "", f"![shift]({shift.name})", "",
                    *paired_shift_section(results), "### Flags by severity", "", *flag_table(results), ""]


def sweep_section(results: dict[str, Any], out_dir: Path) -> list[str]:
    lines = ["## ECE against latency over sample counts", ""]
    if "sweep" not in results:
        return [*lines, PENDING, ""]
    sweep = sweep_plot(results["sweep"], out_dir / f"{results['task']}-ece-latency.png")
    return [*lines, f"S-sample figures use the first S of the same {results['test_draws']} test draws per input; "
            "latency is one input per forward (1-minute load average during these timings: "
            f"{results['load_average_1m']['sweep']:.2f} on {os.cpu_count()} cores).", "",
            *sweep_table(results), "", f"![ece-latency]({sweep.name})", ""]


def ablation_section(results: dict[str, Any]) -> list[str]:
    lines = ["## Ablations", ""]
    if "ablations" not in results:
        return [*lines, PENDING, ""]
    st = results["settings"]
    first = next(iter(results["test_and_ood"].values()))["test"]
    return [*lines, f"Variants train {st['ablation_epochs']} distillation epochs from the same frozen backbone "
            "(`both` is the reference at that budget); tau is the main run's except in the tau variants and the "
            "depth variants (selected again for each K); `floor` uses "
            "only the per-step floor as observed variance; `unlabeled` adds one perturbed copy of every training "
            "input and `corpus` also the sentences of an unlabeled corpus (Debian package descriptions), both "
            "distilled against the teacher's outputs. AUROC columns: mutual information, max softmax and "
            "energy as the OOD score, test split vs the set. Seed rows use the full recipe. Every row is "
            "measured on the first "
            f"{results['ablations'].get('test_inputs', first['n']):,} test {results.get('unit', 'images')} at "
            f"S = {st['samples']}.", "", *ablation_table(results), ""]
