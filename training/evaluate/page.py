"""Renders the evaluation JSON as ``docs/results/<task>.md`` with its plots. Every sentence that compares
methods is computed from the numbers, so a rerun cannot leave stale prose behind."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from models.feature_scores import FEATURE_SCORES
from training.evaluate.claim import claim_section
from training.evaluate.decisions_page import decisions_section
from training.evaluate.kernel_ablation_page import kernel_ablation_section
from training.evaluate.kernel_depth_page import kernel_depth_section
from training.evaluate.page_sections import (
    PENDING,
    ablation_section,
    interval,
    mib,
    pct,
    shift_section,
    shifted,
    sweep_section,
)
from training.evaluate.plots import reliability_grid, risk_coverage_plot


def shift_noise_note(results: dict[str, Any]) -> str:
    """How the shift-fitted noise row was fitted (empty when the evaluation had none)."""
    fit = results.get("shift_noise")
    if not fit:
        return ""
    return (f"The shift-fitted noise shares each sample's noise across tokens with correlation "
            f"{fit['token_correlation']:g} and scales it by {fit['noise_scale']:g}, chosen on {fit['fitted_on']} "
            "(the lowest NLL on that shift among the grid points whose validation NLL is within two standard "
            "errors of the best; docs/method.md, \"Samples that carry information\"), never on a reported set.")


def served_note(results: dict[str, Any]) -> str:
    """How the "DIRECTOR as served" row samples (empty when the evaluation had none)."""
    served = results.get("served")
    if not served:
        return ""
    return (f" \"DIRECTOR as served\" samples the run's kernel as version {served['version']} does for a request "
            f"without n_samples: its manifest's token correlation {served['token_correlation']:g}, noise "
            f"x{served['noise_scale']:g}, S = {served['default_samples']} and temperature "
            f"{served['temperature']:.3f}, as its export chose them.")


def main_table(results: dict[str, Any]) -> list[str]:
    costs = results.get("cost")
    head = ("| method | S | acc % [95% CI] | NLL | Brier | ECE % [95% CI] | adaptive ECE % | MCE % | AURC "
            "| misclass. AUROC |")
    if costs:
        head += " weights (x) | latency ms (x) | peak MiB (x) |"
    lines = [head, "|" + " --- |" * (head.count("|") - 1)]
    for key, r in results["test_and_ood"].items():
        t = r["test"]
        acc = pct(t["accuracy"]) + (f" [{pct(t['accuracy_ci95'][0])}, {pct(t['accuracy_ci95'][1])}]"
                                     if "accuracy_ci95" in t else "")
        row = (f"| {r['label']} | {r['n_samples']} | {acc} | {t['nll']:.4f} | {t['brier']:.4f} "
               f"| {interval(t)} | {pct(t['adaptive_ece'])} | {pct(t['mce'])} | {t['aurc']:.4f} "
               f"| {t['misclassification_auroc']:.4f} |")
        if costs:
            c = costs[key]
            row += (f" {c['parameters']:,} ({c['parameters_ratio']:.1f}) | {c['latency_ms']:.2f} "
                    f"({c['latency_ms_ratio']:.1f}) | {mib(c['peak_memory_bytes'])} "
                    f"({c['peak_memory_bytes_ratio']:.1f}) |")
        lines.append(row)
    return lines


def paired_table(results: dict[str, Any]) -> list[str]:
    """DIRECTOR minus each baseline on the same test inputs, with paired bootstrap intervals."""
    labels = {k: r["label"] for k, r in results["test_and_ood"].items()}
    lines = ["| DIRECTOR method - baseline | accuracy (points) | ECE (points) | NLL |", "| --- | --- | --- | --- |"]
    for pair, d in results.get("paired", {}).items():
        a, b = pair.split(" - ")
        acc, ece, nll = d["accuracy"], d["ece"], d["nll"]
        lines.append(f"| {labels[a]} - {labels[b]} | {100 * acc['difference']:+.2f} [{100 * acc['ci95'][0]:+.2f}, "
                     f"{100 * acc['ci95'][1]:+.2f}] | {100 * ece['difference']:+.2f} [{100 * ece['ci95'][0]:+.2f}, "
                     f"{100 * ece['ci95'][1]:+.2f}] | {nll['difference']:+.4f} [{nll['ci95'][0]:+.4f}, "
                     f"{nll['ci95'][1]:+.4f}] |")
    return lines


def ood_tables(results: dict[str, Any]) -> list[str]:
    first = next(iter(results["test_and_ood"].values()))
    sets = list(first["ood"])
    selection_set = results.get("ood_validation_set", "sklearn sample-photo patches (OOD validation only)")
    lines = ["Each method's score is chosen, as the exporter chooses the manifest's, among the scores the server "
             "computes (from sampled logits: max softmax, predictive entropy, mutual information, energy; for "
             "DIRECTOR and the post-hoc path also what their artifacts' `scored_rows` return: for DIRECTOR the kernel "
             "error, the kernel's squared error against the backbone's own next state, and for both the "
             "feature-space scores MDS, RMDS, KNN and ViM on the backbone's own penultimate features, and their "
             f"standardised combinations) by the lowest worst-case AUROC regret over the OOD-validation families "
             f"({selection_set}; used for nothing else); then on every reported "
             "set: AUROC / AUPR-In / AUPR-Out / FPR at 95% TPR (OOD positive, higher score = more OOD; TPR is the "
             "in-distribution pass rate).", "",
             "| method | chosen score | " + " | ".join(sets) + " |",
             "| --- | --- | " + " | ".join("---" for _ in sets) + " |"]
    for r in results["test_and_ood"].values():
        cells = []
        for s in sets:
            m = r["ood"][s][r["ood_score"]]
            cells.append(f"{m['auroc']:.3f} / {m['aupr_in']:.3f} / {m['aupr_out']:.3f} / {m['fpr95']:.3f}")
        lines.append(f"| {r['label']} | {r['ood_score']} | " + " | ".join(cells) + " |")
    scores = ["max_softmax", "predictive_entropy", "mutual_information", "energy", "mean_logvar", "kernel_error",
              *FEATURE_SCORES, "combined"]
    for s in sets:
        lines += ["", f"AUROC of every score on **{s}** (`-`: undefined for the method, e.g. mutual information "
                      "at S = 1; the mean log-variance (reported only) and the kernel error only for DIRECTOR; the "
                      "feature scores and the combination chosen among the weights on OOD validation (`combined`) "
                      "for DIRECTOR and the post-hoc path):", "",
                  "| method | " + " | ".join(scores) + " | mean MI (nats) |",
                  "| --- | " + " | ".join("---" for _ in scores) + " | --- |"]
        for r in results["test_and_ood"].values():
            row = {("combined" if k.startswith("combined") else k): v for k, v in r["ood"][s].items()}
            cells = [f"{row[n]['auroc']:.3f}" if n in row else "-" for n in scores]
            lines.append(f"| {r['label']} | " + " | ".join(cells) + f" | {row['mean_mutual_information']:.2e} |")
    return lines


DETECTOR_LABELS = {"deterministic": "Deterministic backbone", "mc_dropout": "MC dropout", "ensemble": "Deep ensemble",
                   "director": "DIRECTOR"}


def detector_tables(results: dict[str, Any]) -> list[str]:
    """Per OOD set: every free detector on every method's features, and the served score against each."""
    det = results["detectors"]
    sets = list(det["served_score_auroc"])
    names = list(next(iter(next(iter(det["methods"].values()))["ood"].values())))
    lines = ["MDS, RMDS, KNN (k = 50, L2-normalised features, a bounded bank) and ViM on each method's own penultimate "
             "features (the input of its class head: per sample for MC dropout and DIRECTOR, per member for the "
             "ensemble, each scored with statistics fitted on the training split and averaged per input), GEN "
             "(gamma 0.1) and MaxLogit on its logits. The served score is DIRECTOR's S = 1 choice above. Cells: AUROC "
             "/ FPR at 95% TPR; below each table, served minus detector AUROC with a 95% interval from "
             f"{results['settings']['bootstrap']} paired resamples of the test and OOD inputs (above 0: the served "
             "score is better)."]
    for s in sets:
        served = det["served_score_auroc"][s]
        lines += ["", f"**{s}**: the served score reaches AUROC {served['auroc']:.3f} / FPR95 {served['fpr95']:.3f}.",
                  "", "| method (rows per input) | " + " | ".join(names) + " |",
                  "| --- | " + " | ".join("---" for _ in names) + " |"]
        for key, entry in det["methods"].items():
            row = entry["ood"][s]
            cells = [f"{row[n]['auroc']:.3f} / {row[n]['fpr95']:.3f}" for n in names]
            lines.append(f"| {DETECTOR_LABELS.get(key, key)} ({entry['rows_per_input']}) | " + " | ".join(cells) + " |")
        backbone = det["methods"]["deterministic"]["ood"][s]
        diffs = [f"{n} {backbone[n]['served_minus_detector']['difference']:+.3f} "
                 f"[{backbone[n]['served_minus_detector']['ci95'][0]:+.3f}, "
                 f"{backbone[n]['served_minus_detector']['ci95'][1]:+.3f}]" for n in names]
        lines += ["", "Served minus the backbone's detectors: " + "; ".join(diffs) + "."]
    return lines


def variance_table(results: dict[str, Any]) -> list[str]:
    """The kernel's squared error against the backbone's next state beside its predicted variance, per set."""
    if "variance" not in results:
        return [PENDING]
    lines = ["Per input, averaged over the diffused steps along the backbone's own trajectory, tokens and features: "
             "the kernel's squared mean error against the backbone's next state and its predicted variance (without "
             "the noise temperature). Spearman: their rank correlation over the set's inputs. AUROC against the test "
             "split: the error's is what a variance head that predicted the error exactly would reach as an OOD score.",
             "", "| set | mean squared error | mean predicted variance | Spearman | AUROC of the error | "
             "AUROC of the variance |", "| --- | --- | --- | --- | --- | --- |"]
    for name, e in results["variance"].items():
        spearman = "-" if e["spearman"] is None else f"{e['spearman']:.3f}"
        aurocs = [f"{e[k]:.3f}" if k in e else "-" for k in ("auroc_error", "auroc_variance")]
        lines.append(f"| {name} | {e['mean_error']:.3e} | {e['mean_variance']:.3e} | {spearman} | "
                     + " | ".join(aurocs) + " |")
    return lines


def findings(results: dict[str, Any]) -> list[str]:
    """Computed comparisons of DIRECTOR at the default S against the baselines."""
    rows = results["test_and_ood"]
    s = results["settings"]["samples"]
    d = rows[f"director_s{s}"]
    out = []
    baselines = ("deterministic", "temperature_scaling", "mc_dropout", "ensemble", "posthoc", "hybrid")
    for key in (k for k in baselines if k in rows):
        b = rows[key]
        dl, dh = d["test"]["ece_ci95"]
        bl, bh = b["test"]["ece_ci95"]
        if dh < bl:
            verdict = "lower, with disjoint intervals"
        elif bh < dl:
            verdict = "higher, with disjoint intervals"
        else:
            verdict = "intervals overlap"
        ood_d = sum(d["ood"][k][d["ood_score"]]["auroc"] for k in d["ood"]) / len(d["ood"])
        ood_b = sum(b["ood"][k][b["ood_score"]]["auroc"] for k in b["ood"]) / len(b["ood"])
        parts = [f"ECE {pct(d['test']['ece'])}% vs {pct(b['test']['ece'])}% ({verdict})",
                 f"accuracy {pct(d['test']['accuracy'])}% vs {pct(b['test']['accuracy'])}%",
                 f"NLL {d['test']['nll']:.4f} vs {b['test']['nll']:.4f}",
                 f"mean OOD AUROC (own chosen score) {ood_d:.3f} vs {ood_b:.3f}"]
        if "shift" in results:
            where, ours = shifted(results["shift"][f"director_s{s}"])
            parts.append(f"ECE {where} {pct(ours['ece'])}% vs {pct(shifted(results['shift'][key])[1]['ece'])}%")
        if "cost" in results:
            parts.append(f"latency {results['cost'][f'director_s{s}']['latency_ms']:.2f} vs "
                         f"{results['cost'][key]['latency_ms']:.2f} ms")
        out.append(f"- vs {b['label']}: " + "; ".join(parts) + ".")
    return out


def test_split_section(results: dict[str, Any], probs: dict[str, torch.Tensor], labels: torch.Tensor, out_dir: Path
                       ) -> list[str]:
    """The test split: the methods' table, reliability and risk-coverage plots, DIRECTOR's standing, paired."""
    task = results["task"]
    reliability = reliability_grid(probs, labels, out_dir / f"{task}-reliability.png")
    risk_coverage = risk_coverage_plot(probs, labels, out_dir / f"{task}-risk-coverage.png")
    first = next(iter(results["test_and_ood"].values()))["test"]
    st = results["settings"]
    binning = "; ".join(f"{k}: {v}" for k, v in results["binning"].items())
    cost_note = ("Costs are measured in the same run on this machine: weights are the stored parameters and buffers "
                 "(embedding tables included); latency is one input per forward at the "
                 "method's S (median), peak memory the rise of resident memory during one forward of "
                 f"{st['latency_images']} inputs in a fresh process; (x) is the ratio to the deterministic backbone; "
                 "1-minute load average during the timings: "
                 f"{results['load_average_1m'].get('cost', float('nan')):.2f} on {os.cpu_count()} cores. "
                 if "cost" in results else "Costs: " + PENDING + " ")
    return [
        f"## Test split ({first['n']:,} {results.get('unit', 'images')})", "",
        f"Calibration binning: {binning}. ECE interval: 95% percentile bootstrap ({st['bootstrap']} resamples); "
        "binned ECE is biased upward under resampling, so for a well-calibrated method the interval can sit above "
        "the point estimate: compare methods by their intervals, not their third digit. "
        + cost_note + "Temperatures are fitted on the validation split; the noise temperature scales every DIRECTOR "
        f"step's std and was fitted on validation NLL over {st['noise_scale_grid']}: {results['noise_scale']}. "
        + shift_noise_note(results) + served_note(results), "",
        *main_table(results), "", f"![reliability]({reliability.name})", "",
        "Risk against coverage: keep the most confident inputs first; the curve gives the error rate of what is "
        "kept at each share kept, so a threshold can be chosen by the error rate a user accepts (AURC, the area "
        "under it, is in the JSON).", "", f"![risk-coverage]({risk_coverage.name})", "",
        "### Where DIRECTOR (default S) stands", "", *findings(results), "", *claim_section(results),
        *(["### DIRECTOR against each baseline, paired", "",
            f"Differences on the same test inputs; 95% intervals from {st['bootstrap']} paired bootstrap resamples "
            "(an interval that excludes 0 is a difference this test split can see).", "", *paired_table(results), ""]
          if results.get("paired") else []),
    ]


def write_evaluation(results: dict[str, Any], probs: dict[str, torch.Tensor], labels: torch.Tensor, out_dir: Path,
                     command: str) -> Path:
    """The page; a stage missing from ``results`` (not in ``evaluate.stages``) is marked pending."""
    task = results["task"]
    labels_by_key = {k: r["label"] for k, r in results["test_and_ood"].items()}
    lines = [
        f"# {task}: uncertainty methods compared", "",
        f"Produced {results['date']} from commit `{results['git_commit']}` (torch {results['torch']}, "
        f"{results['threads']} CPU threads) with:", "", "```bash", command, "```", "",
        "Every number below is in the JSON beside this page. Trained baselines, ablation kernels and sampled "
        "logits are cached under the run folder, so the command resumes and a rerun only re-renders. "
        f"Stage times: {', '.join(f'{k} {v / 60:.1f} min' for k, v in results['seconds'].items())}.", "",
        *test_split_section(results, probs, labels, out_dir),
        *kernel_ablation_section(results),
        "## Out-of-distribution detection", "", *ood_tables(results), "",
        "### The free detectors, on each method's own features", "",
        *(detector_tables(results) if "detectors" in results else [PENDING]), "",
        "### Does DIRECTOR's predicted variance follow its own error?", "", *variance_table(results), "",
        "### DIRECTOR's own contribution: the kernel error over K steps", "",
        *(kernel_depth_section(results, out_dir) if "kernel_depth" in results else [PENDING]), "",
    ]
    lines += [*shift_section(results, labels_by_key, out_dir),
              *(decisions_section(results, out_dir) if "decisions" in results
                else ["## Prediction sets and abstentions", "", PENDING, ""]),
              *sweep_section(results, out_dir), *ablation_section(results)]
    page = out_dir / f"{task}.md"
    page.write_text("\n".join(lines))
    return page
