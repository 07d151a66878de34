"""Stage 4: the evaluation table. Every method runs on the same backbone and data; sampled logits
are cached (``training.evaluate.logit_cache``), trained baselines and ablation kernels are cached checkpoints, so the
command resumes where it stopped and a rerun only re-renders.

Methods: deterministic backbone, temperature scaling, MC dropout, deep ensemble, DIRECTOR at S = 1 and S,
DIRECTOR + temperature scaling, DIRECTOR + noise temperature. Sets: training (feature statistics only), validation
(fitting only), test, the OOD-validation set (score choice only), the reported OOD sets, and the shifted sets.
Stages (``evaluate.stages``): test_and_ood (always first: it chooses each method's OOD score and flag), detectors
(``training.evaluate.detectors``), shift (``training.evaluate.shift``), decisions (``training.evaluate.decisions``:
prediction sets and abstentions, calibrated on the export's calibration split), sweep, cost, ablations, variance,
kernel_depth (``training.evaluate.kernel_depth``: the kernel error over K steps, alone and with a feature score).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from models.uncertainty import ScoreTerm, ood_score, summarize
from training.config import PipelineConfig
from training.data.ood_families import selection_description
from training.evaluate.ablations import ablation_config, ensure_distilled, seed_config
from training.evaluate.cost import latencies_per_input_ms, parameter_count, peak_memory_bytes, save_model_file
from training.evaluate.decisions import evaluate_decisions
from training.evaluate.detectors import evaluate_detectors
from training.evaluate.evaluation import Evaluation, Method, build_methods, build_sources, family_set, summary_of
from training.evaluate.kernel_ablation import kernel_ablation
from training.evaluate.kernel_depth import evaluate_kernel_depth
from training.evaluate.logit_cache import fingerprint
from training.evaluate.shift import evaluate_shift
from training.evaluate.target_checks import SERVED_ROWS
from training.evaluate.targets import RESULTS, write_targets
from training.loading import (
    BACKBONE_FILE,
    DIRECTOR_FILE,
    AnySplit,
    load_director,
)
from training.metrics import BINNING, accuracy_interval, classification_report, ece_bootstrap, paired_bootstrap
from training.ood_metrics import ood_report, threshold_at_tpr
from training.posthoc.ood_selection import (
    Candidate,
    ScoreInputs,
    choose_ood_score,
)
from training.posthoc.rollout_diagnostics import KernelErrors, mean_logvar_score, variance_report
from training.posthoc.writing import git_commit, json_safe
from training.runtime import set_threads


def calibration_block(probs: torch.Tensor, labels: torch.Tensor, n_boot: int) -> dict[str, Any]:
    _, low, high = ece_bootstrap(probs, labels, n_boot=n_boot)
    return {**classification_report(probs, labels), "ece_ci95": [low, high],
            "accuracy_ci95": accuracy_interval(probs, labels, n_boot), "n": int(labels.shape[0])}


def evaluate_test_and_ood(evaluation: Evaluation, methods: list[Method], draws_test: int) -> dict[str, Any]:
    """Test-split calibration table and, per OOD set, every reported score of every method; each method's own score is
    chosen over the OOD-validation families as the exporter chooses the manifest's (``training.posthoc.ood_selection``),
    except an exported version's row, which uses that manifest's own rule (``served_rule``).
    DIRECTOR's and the post-hoc path's candidates include what their artifacts' ``scored_rows`` return (the kernel
    error, the feature-space scores); DIRECTOR's S = 1 choice is recorded as the served score the detectors stage
    compares against, and every method's chosen score on the test and OOD sets is kept for the paired comparisons."""
    inputs, ev, seed = evaluation.inputs, evaluation.ev, evaluation.cfg.seed
    test, ood_sets = inputs.test, inputs.ood
    families = {family_set(name): family.split for name, family in inputs.ood_families.items()}
    weights = {family_set(name): family.weight for name, family in inputs.ood_families.items()}
    director = evaluation.sources["director"].model
    # the mean predicted log-variance along DIRECTOR's rollout (reported only, never a candidate)
    logvar = {name: mean_logvar_score(director, split, seed)
              for name, split in {"test": test, "val": inputs.val, **families, **ood_sets}.items()}  # name -> [N]
    results: dict[str, Any] = {}
    for method in tqdm(methods, desc="test + OOD", leave=False):
        def score_inputs(set_name: str, split: AnySplit, draws: int | None = None, method: Method = method
                         ) -> ScoreInputs:
            native = evaluation.native_scores(method, set_name, split)
            return ScoreInputs(summary_of(evaluation.logits(method.source, set_name, split, draws), method, native),
                               native)

        draws = draws_test if method.source in ("director", "mc_dropout") else None
        test_inputs, val_inputs = score_inputs("test", test, draws), score_inputs("val", inputs.val)
        choice = choose_ood_score(val_inputs, {name: score_inputs(name, split) for name, split in families.items()},
                                  method.n_samples, weights)
        selection = dict(choice.selection_auroc)
        if method.family == "director":
            selection["mean_logvar"] = sum(ood_report(logvar["val"], logvar[name])["auroc"] * weights[name]
                                           for name in families) / sum(weights.values())
        label, rule, threshold = served_rule(evaluation.served) if method.key in SERVED_ROWS else \
            (choice.label, choice.rule_at(method.n_samples), None)
        if threshold is None:
            threshold = threshold_at_tpr(val_inputs.score(rule.name, rule.terms))
        evaluation.flag_rules[method.key] = (rule, threshold)
        chosen = {"test": test_inputs.score(rule.name, rule.terms)}  # set -> the method's own score [N]
        per_set = {}
        for set_name, split in ood_sets.items():
            set_inputs = score_inputs(set_name, split)
            chosen[set_name] = set_inputs.score(rule.name, rule.terms)
            row = {name: ood_report(test_inputs.score(c.name, c.terms), set_inputs.score(c.name, c.terms))
                   for name, c in {**choice.reported(), label: rule}.items()}
            if method.family == "director":
                row["mean_logvar"] = ood_report(logvar["test"], logvar[set_name])
            row["mean_mutual_information"] = float(set_inputs.summary.mutual_information.mean())
            per_set[set_name] = row
        evaluation.chosen_scores[method.key] = chosen
        if method.key == "director_s1" or method.key in SERVED_ROWS:  # a served version's row comes last
            evaluation.served_scores, evaluation.served_score_method = dict(chosen), method.key
        results[method.key] = {
            "label": method.label, "n_samples": method.n_samples, "temperature": method.temperature,
            **({"temperature_slope": method.by_score.slope} if method.by_score else {}),
            "test": {**calibration_block(test_inputs.summary.probabilities, test.labels, ev.bootstrap),
                     "mean_mutual_information": float(test_inputs.summary.mutual_information.mean())},
            "ood_selection_auroc": selection, "ood_selection_regret": choice.regret.get(label),
            "ood_score": label, "ood": per_set, "flag_threshold": threshold,
            "test_flag_rate": float((chosen["test"] > threshold).float().mean()),
        }
    return results


def served_rule(served: dict[str, Any]) -> tuple[str, Candidate, float]:
    """An exported version's own OOD rule (``evaluation.served_ood_rule``: its manifest's score, terms and threshold
    at its default S), so that its row measures the score the server serves."""
    ood = served["ood"]
    terms = tuple(ScoreTerm(**term) for term in ood["terms"])
    return ood["label"], Candidate(ood["score"], terms), float(ood["threshold"])


def evaluate_costs(evaluation: Evaluation, methods: list[Method], folder: Path) -> dict[str, Any]:
    """Parameters, latency per input (batch of one) and peak memory per method, and ratios to deterministic.
    Text models are measured as pickled eager modules (the baselines hold transformers modules, which do not
    script; DIRECTOR is measured the same way so the ratios compare like with like)."""
    ev, inputs, cfg = evaluation.ev, evaluation.inputs, evaluation.cfg
    scriptable = evaluation.opened.family.scriptable
    singles = inputs.singles(inputs.test, ev.latency_images)
    batch = inputs.test.first_args(ev.latency_images)
    keys = list(dict.fromkeys((m.source, m.n_samples) for m in methods))  # [(source, S)] each timed once
    latencies = latencies_per_input_ms({(src, s): (evaluation.sources[src].model, s) for src, s in keys}, singles,
                                       ev.latency_repeats)
    measured: dict[tuple[str, int], dict[str, float]] = {}
    for source_name, n_samples in tqdm(keys, desc="cost", leave=False):
        source = evaluation.sources[source_name]
        path = save_model_file(source.model, folder, source.model_id, scriptable)
        measured[(source_name, n_samples)] = {
            "parameters": parameter_count(source.model), "latency_ms": latencies[(source_name, n_samples)],
            "peak_memory_bytes": peak_memory_bytes(path, batch, n_samples, cfg.threads or 1),
        }
        if not scriptable:  # the pickle's private folder (save_model_file): nothing pickled stays behind
            shutil.rmtree(path.parent)
    base = measured[("deterministic", 1)]
    out: dict[str, Any] = {}
    for method in methods:
        m = measured[(method.source, method.n_samples)]
        out[method.key] = {**m, **{f"{k}_ratio": m[k] / max(base[k], 1e-12) for k in m}}
    return out


def evaluate_sweep(evaluation: Evaluation, draws_test: int) -> dict[str, Any]:
    """ECE, NLL and accuracy against latency over sample counts, for DIRECTOR and MC dropout. S-sample
    estimates are the first S of the cached test draws (draws are i.i.d., so any S of them are an S-draw)."""
    inputs, ev = evaluation.inputs, evaluation.ev
    singles = inputs.singles(inputs.test, ev.latency_images)
    sources = ("director", "mc_dropout")
    latencies = latencies_per_input_ms({(src, s): (evaluation.sources[src].model, s) for src in sources
                                        for s in ev.sweep_samples}, singles, ev.latency_repeats)
    out: dict[str, Any] = {}
    for source in sources:
        logits = evaluation.logits(source, "test", inputs.test, draws_test)  # [S_max, N, C]
        rows = {}
        for s in ev.sweep_samples:
            report = classification_report(summarize(logits[:s]).probabilities, inputs.test.labels)
            rows[str(s)] = {"accuracy": report["accuracy"], "ece": report["ece"], "nll": report["nll"],
                            "latency_ms": latencies[(source, s)]}
        out[source] = rows
    return out


def evaluate_ablations(evaluation: Evaluation) -> dict[str, Any]:
    """Each ablation variant (and each extra distillation seed) on the test split at S and S = 1."""
    cfg, ev = evaluation.cfg, evaluation.ev
    test = evaluation.inputs.test.head(ev.ablation_inputs)
    test_name = "test" if len(test) == len(evaluation.inputs.test) else f"test-n{len(test)}"
    ood_sets = evaluation.inputs.ood
    variants: list[tuple[str, str, PipelineConfig]] = [("ablation", name, ablation_config(cfg, name))
                                                      for name in ev.ablations]
    variants += [("seed", f"seed{s}", seed_config(cfg, s)) for s in [cfg.seed, *ev.distil_seeds]]
    out: dict[str, Any] = {"ablation": {}, "seed": {}, "test_inputs": len(test)}
    if not ev.ablations and not ev.distil_seeds:
        return out  # the main run alone says nothing about seed variance: report no ablations at all
    for group, name, variant in tqdm(variants, desc="ablations", leave=False):
        run = ensure_distilled(cfg, variant)
        director, payload = load_director(run)
        model_id = f"dir-{fingerprint(run / BACKBONE_FILE, run / DIRECTOR_FILE)}"
        evaluation.add_source(model_id, director, model_id, ev.samples)
        logits = evaluation.logits(model_id, test_name, test)
        summary = summarize(logits)
        entry = {k: v for k, v in classification_report(summary.probabilities, test.labels).items()
                 if k in ("accuracy", "ece", "nll", "brier")}
        entry["accuracy_s1"] = classification_report(summarize(logits[:1]).probabilities, test.labels)["accuracy"]
        entry["mean_mutual_information"] = float(summary.mutual_information.mean())
        entry["tau"] = payload["tau"]
        entry["depth"] = payload.get("depth")
        entry["observed_variance"] = payload["observed_variance"]
        entry["epochs"] = len(payload["history"])
        for set_name, split in ood_sets.items():
            ood = summarize(evaluation.logits(model_id, set_name, split))
            entry[f"mi_{set_name}"] = float(ood.mutual_information.mean())
            entry[f"auroc_mi_{set_name}"] = ood_report(summary.mutual_information, ood.mutual_information)["auroc"]
            for score in ("max_softmax", "energy"):  # what the served OOD scores make of the variant
                entry[f"auroc_{score}_{set_name}"] = ood_report(ood_score(summary, score),
                                                                ood_score(ood, score))["auroc"]
        out[group][name] = entry
    seeds = list(out["seed"].values())
    if not seeds:
        return out
    out["seed_mean_std"] = {k: {"mean": float(torch.tensor([s[k] for s in seeds]).mean()),
                                "std": float(torch.tensor([s[k] for s in seeds]).std()) if len(seeds) > 1 else 0.0}
                            for k in ("accuracy", "ece", "nll", "accuracy_s1", "mean_mutual_information")}
    return out


def paired_differences(methods: list[Method], probs: dict[str, torch.Tensor], labels: torch.Tensor, n_boot: int,
                       seed: int) -> dict[str, dict[str, Any]]:
    """Every DIRECTOR method minus every baseline on the test split (accuracy, ECE, NLL) with paired bootstrap
    intervals, keyed ``"<director key> - <baseline key>"``."""
    directors = [m for m in methods if m.family == "director"]
    baselines = [m for m in methods if m.family != "director"]
    return {f"{d.key} - {b.key}": paired_bootstrap(probs[d.key], probs[b.key], labels, n_boot, seed)
            for d in directors for b in baselines}


Stage = Callable[[], Any]


def run_stages(cfg: PipelineConfig, stages: list[tuple[str, Stage]], results: dict[str, Any]) -> None:
    """The stages ``evaluate.stages`` names, in order, each timed, with how busy the machine was."""
    unknown = set(cfg.evaluate.stages) - {name for name, _ in stages}
    if unknown or "test_and_ood" not in cfg.evaluate.stages:
        raise ValueError(f"evaluate.stages must include test_and_ood and name only {[n for n, _ in stages]}, "
                         f"got {cfg.evaluate.stages}")
    for name, stage in stages:
        if name not in cfg.evaluate.stages:
            continue
        t0 = time.perf_counter()
        print(f"evaluate: {name}")
        results[name] = stage()
        results.setdefault("seconds", {})[name] = round(time.perf_counter() - t0, 1)
        # other work on the machine inflates the latencies: record how busy it was
        results.setdefault("load_average_1m", {})[name] = os.getloadavg()[0]


def evaluate(cfg: PipelineConfig, command: str | None = None) -> Path:
    """Run (or resume) the whole evaluation and write ``docs/results/<task>.{md,json}`` and the plots."""
    from training.evaluate.page import write_evaluation

    start = time.perf_counter()
    set_threads(cfg.threads)
    evaluation = Evaluation(cfg)
    fitted = build_sources(evaluation)
    errors = KernelErrors(evaluation.sources["director"].model, evaluation.opened.view())
    methods = build_methods(evaluation)
    draws_test = fitted["draws_test"]
    results: dict[str, Any] = {
        "task": cfg.evaluate.task, "config": cfg.source, "git_commit": git_commit(),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "torch": torch.__version__,
        "threads": cfg.threads, "binning": BINNING, "settings": asdict(cfg.evaluate),
        "noise_scale": fitted["noise_scale"], "noise_scale_val_nll": fitted["noise_scale_val_nll"],
        "shift_noise": fitted.get("shift_noise"), "served": fitted.get("served"),
        "test_draws": draws_test, "modality": cfg.modality, "unit": evaluation.inputs.unit,
        "ood_validation_set": selection_description(evaluation.inputs.ood_families),
        "posthoc_fit": evaluation.posthoc_fit,
        "methods": [asdict(m) for m in methods],
    }
    stages: list[tuple[str, Stage]] = [
        ("test_and_ood", lambda: evaluate_test_and_ood(evaluation, methods, draws_test)),
        ("detectors", lambda: evaluate_detectors(evaluation, draws_test)),
        ("shift", lambda: evaluate_shift(evaluation, methods)),
        ("decisions", lambda: evaluate_decisions(evaluation, methods)),
        ("sweep", lambda: evaluate_sweep(evaluation, draws_test)),
        ("cost", lambda: evaluate_costs(evaluation, methods, evaluation.run_dir / "eval" / "artifacts")),
        ("ablations", lambda: evaluate_ablations(evaluation)),
        ("variance", lambda: variance_report(errors, evaluation.inputs.test, evaluation.inputs.ood)),
        ("kernel_depth", lambda: evaluate_kernel_depth(evaluation, draws_test,
                                                       results["test_and_ood"]["director_s1"]["ood_score"])),
    ]
    run_stages(cfg, stages, results)
    test = evaluation.inputs.test
    probs = {m.key: summary_of(evaluation.logits(m.source, "test", test,
                                                  draws_test if m.source in ("director", "mc_dropout") else None),
                               m, evaluation.native_scores(m, "test", test)).probabilities for m in methods}
    results["paired"] = paired_differences(methods, probs, test.labels, cfg.evaluate.bootstrap, cfg.seed)
    results["kernel_ablation"] = kernel_ablation(evaluation, methods, results)
    results["seconds"]["total"] = round(time.perf_counter() - start, 1)
    out_dir = Path(cfg.export.docs_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / f"{cfg.evaluate.task}.json"
    json_path.write_text(json.dumps(json_safe(results), indent=2, allow_nan=False) + "\n")
    labelled = {m.label: probs[m.key] for m in methods}
    page = write_evaluation(results, labelled, test.labels, out_dir,
                            command or f"python -m training evaluate --config {cfg.source}")
    print(f"wrote {page} and {json_path} in {results['seconds']['total'] / 60:.1f} min")
    if out_dir.resolve() == RESULTS.resolve():  # the project's own results: the targets page follows them
        print(f"wrote {write_targets()}")
    return page
