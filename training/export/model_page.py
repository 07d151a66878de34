"""Renders an exported model's results page (``docs/results/<name>.md``) from its manifest."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _pct(value: float) -> str:
    return f"{100 * value:.2f}%"


def _row(name: str, m: dict[str, Any]) -> str:
    low, high = m["ece_ci95"]
    return f"| {name} | {_pct(m['accuracy'])} | {_pct(m['ece'])} [{_pct(low)}, {_pct(high)}] | {m['nll']:.4f} |"


def _cell(values: dict[str, float], key: str) -> str:
    return f"{values[key]:.4f}" if key in values else "-"


def _minutes(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds / 60:.1f} min"


def _sampling_choice(manifest: dict[str, Any]) -> list[str]:
    """How the default sample count and the served temperature were chosen (both on validation)."""
    prov, s = manifest["provenance"], manifest["sampling"]["default_samples"]
    lines: list[str] = []
    table = prov.get("default_samples_nll") or {}
    if table:
        reference = max(table, key=int)
        lines += [f"Default sample count **S={s}**: the smallest S whose validation NLL is within two standard errors "
                  f"of S={reference}'s (paired per-input differences):", "",
                  "| S | validation NLL | minus the reference | standard error |", "| --- | --- | --- | --- |"]
        lines += [f"| {k} | {v['nll']:.4f} | {v['minus_reference']:+.4f} | {v['stderr']:.4f} |"
                  for k, v in sorted(table.items(), key=lambda kv: int(kv[0]))]
        lines.append("")
    fit = prov.get("temperature_fit") or {}
    if fit:
        kept = manifest.get("temperature", 1.0)
        lines += [f"Served temperature **{kept:.3f}**: fitted on the first half of validation "
                  f"(T={fit['temperature_first_half']:.3f}), it moved the second half's NLL from {fit['nll_t1']:.4f} "
                  f"to {fit['nll_fitted']:.4f}, so it is " + ("kept (refitted on all of validation)." if kept != 1.0
                                                               else "not served."), ""]
    return lines


def _served_against_features(manifest: dict[str, Any]) -> list[str]:
    """A line per reported set: the served score's test AUROC against the best feature-space score's (none when the
    artifact carries no feature scores)."""
    from models.uncertainty import FEATURE_SCORES

    ood, tm = manifest["ood"], manifest["provenance"]["test_metrics"]
    served = ood.get("selection_choice", ood["score"])
    out = []
    for name, block in tm["ood"].items():
        features = {f: block["auroc_vs_test"][f] for f in FEATURE_SCORES if f in block["auroc_vs_test"]}
        if not features or served not in block["auroc_vs_test"]:
            continue
        best = max(features, key=features.get)
        mine = block["auroc_vs_test"][served]
        out.append(f"- {name}: served {served} {mine:.4f} against the best feature score ({best}) "
                   f"{features[best]:.4f}: {'at least as good' if mine >= features[best] else 'lower'}")
    return ["The served score against the free detectors on the same backbone (test AUROC):", "", *out, ""] \
        if out else []


def render_results(manifest: dict[str, Any], command: str, reliability_png: str | None) -> str:
    prov = manifest["provenance"]
    tm = prov["test_metrics"]
    s = manifest["sampling"]["default_samples"]
    director = tm[f"director_s{s}"]
    backbone, ts = tm["backbone"], tm["backbone_temperature_scaled"]
    ood = manifest["ood"]
    text = manifest.get("modality") == "text"
    secs = prov["seconds"]
    # the reported scores (logit, per-input, the best combination); every candidate's validation AUROC is in the
    # manifest's ood.selection_auroc
    columns = list(next(iter(tm["ood"].values()))["auroc_vs_test"])
    lines = [
        f"# {manifest['name']} v{manifest['version']}: results",
        "",
        f"Produced {prov['date']} from commit `{prov['git_commit']}` with:",
        "",
        "```bash",
        command,
        "```",
        "",
        f"Config `{prov['config']}`, seed {prov['seed']}, dataset {prov['dataset']}. "
        f"Stage times: fit-backbone {_minutes(secs['fit_backbone'])}, distil {_minutes(secs['distil'])}, "
        f"export (with the evaluation below) {_minutes(secs['export'])}.",
        "",
        f"Backbone: {prov['backbone']['parameters']:,} parameters; DIRECTOR artifact: "
        f"{manifest['artifact']['parameters']:,} parameters ({manifest['sampling']['steps']} steps, "
        f"one DiT block).",
        "",
        f"## Test split ({backbone['n']:,} {'sentences' if text else 'images'})",
        "",
        "ECE: 15 equal-width bins on the top-label confidence, with a 95% percentile bootstrap interval (200 "
        "resamples). Binned ECE is biased upward under resampling, so for a well-calibrated model the interval "
        "can sit above the point estimate; compare methods by their intervals, not their third digit.",
        "",
        "| method | accuracy | ECE [95% CI] | NLL |",
        "| --- | --- | --- | --- |",
        _row("backbone (deterministic)", backbone),
        _row(f"backbone + temperature scaling (T={ts['temperature']:.3f}, fit on validation)", ts),
        *([_row("DIRECTOR, S=1", tm["director_s1"])] if s != 1 else []),
        _row(f"DIRECTOR, S={s}" + (f", served temperature {manifest['temperature']:.3f}"
                                   if manifest.get("temperature", 1.0) != 1.0 else ""), director),
        "",
        *_sampling_choice(manifest),
    ]
    if not text:  # the foundation issue's figures are stated for the Fashion-MNIST vision model
        lines += [
            "Requirements of the foundation issue, measured:",
            "",
            f"- backbone accuracy {_pct(backbone['accuracy'])} (>= 89% required): "
            f"{'met' if backbone['accuracy'] >= 0.89 else 'NOT met'}",
            f"- DIRECTOR S={s} accuracy within 1 point of the backbone: "
            f"{(director['accuracy'] - backbone['accuracy']) * 100:+.2f} points "
            f"({'met' if director['accuracy'] >= backbone['accuracy'] - 0.01 else 'NOT met'})",
            f"- DIRECTOR ECE lower than the backbone's by more than the bootstrap half-width: "
            f"{_pct(backbone['ece'])} - {_pct(director['ece'])} = {_pct(backbone['ece'] - director['ece'])} vs "
            f"half-width {_pct(backbone['ece_half_width'])} ("
            f"{'met' if backbone['ece'] - director['ece'] > backbone['ece_half_width'] else 'NOT met'})",
            "",
        ]
    if reliability_png:
        lines += [f"![reliability diagram]({reliability_png})", ""]
    lines += [
        "## Uncertainty and OOD",
        "",
        f"Mean mutual information (nats, S={s}): test split {director['mean_mutual_information']:.2e}, "
        + ", ".join(f"{name} {v['mean_mutual_information']:.2e}" for name, v in tm["ood"].items()) + ".",
        "",
        f"The manifest's OOD score is **{ood.get('selection_choice', ood['score'])}** (fallback "
        f"**{ood['fallback_score']}** where it is undefined), chosen by AUROC on the OOD validation set "
        f"({ood['selection_set']}), which is none of the reported sets:",
        "",
        "| score | " + " | ".join(columns) + " |",
        "| --- | " + " | ".join("---" for _ in columns) + " |",
        "| AUROC, OOD validation | " + " | ".join(_cell(ood["selection_auroc"], c) for c in columns) + " |",
    ]
    for name, block in tm["ood"].items():
        lines.append(f"| AUROC, test vs {name} | " + " | ".join(_cell(block["auroc_vs_test"], c) for c in columns)
                     + " |")
    lines += [
        "",
        *_served_against_features(manifest),
        "`kernel_error` is the kernel's squared mean error against the backbone's own next state (the artifact "
        "carries the backbone's last transitions and returns it from `scored_rows`). `mds`, `rmds`, `knn` and `vim` "
        "are feature-space scores on the backbone's own penultimate features along that path (Mahalanobis to the "
        "nearest class, relative Mahalanobis, 1 - cosine to the 50th nearest training feature, ViM), their "
        "statistics fitted on the training split and carried in the artifact. A `combined (a w=... + b)` score is "
        "w * z(a) + (1 - w) * z(b), z standardised on validation (log scale for the kernel error and mds; terms in "
        "the manifest's `ood.combination`); the best combination is shown. `mean_logvar` (the mean predicted "
        "log-variance along an S=1 rollout) is reported, not selectable.",
        "",
        f"Flagged as OOD at the S={s} threshold (95% of validation inputs pass): test split "
        f"{_pct(director['flagged_rate'])}, "
        + ", ".join(f"{n} {_pct(v['flagged_rate'])}" for n, v in tm["ood"].items()) + ".",
        "",
        "Thresholds per sample count: " + ", ".join(
            f"S={k}: {v['score']} > {v['threshold']:.4g}" for k, v in ood["thresholds"].items()) + ".",
        "",
        "## The observed process and the kernel",
        "",
        f"Observed variance: `{manifest['variance']['observed_variance']}`, tau = {manifest['variance']['tau']} "
        "(the largest value on the grid whose S=1 sampled observed process keeps validation accuracy within "
        "1 point of the backbone). S=1 validation accuracy by tau: "
        + ", ".join(f"{k}: {_pct(v)}" for k, v in manifest["variance"]["tau_selection_accuracy"].items()) + ".",
        "",
        "Noise temperature (a scale on every step's std, fitted on validation NLL at "
        f"S={prov.get('noise_scale_fit_samples', s)}): "
        f"**{manifest['sampling']['noise_scale']}**"
        + (" (validation NLL by scale: " + ", ".join(f"{k}: {v:.4f}" for k, v in prov["noise_scale_nll"].items())
           + ")." if prov["noise_scale_nll"] else " (not fitted)."),
        "",
        "| step t | floor_t | mean raw attention variance | median predicted std / RMS(X_t) "
        "| mean predicted log-var |",
        "| --- | --- | --- | --- | --- |",
    ]
    stats = prov["step_statistics"]
    rollout = prov["rollout"]
    for t, floor in enumerate(manifest["variance"]["floors"]):
        lines.append(f"| {t + 1} | {floor:.3e} | {stats['raw_var_mean'][t]:.3e} | "
                     f"{rollout['median_std_over_rms'][t]:.4f} | {rollout['mean_logvar'][t]:.3f} |")
    lines += ["", "Distillation, per epoch (validation subset; per-step values are training-epoch means):", "",
              "| epoch | L1 | L2 | val acc | val ECE | val NLL | var_obs per step | mean sq. error per step "
              "| var_p per step |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in prov["distil_history"]:
        fmt = lambda v: ", ".join(f"{x:.2e}" for x in v)  # noqa: E731
        lines.append(f"| {r['epoch']} | {r['l1']:.4f} | {r['l2']:.4f} | {_pct(r['val_accuracy'])} | "
                     f"{_pct(r['val_ece'])} | {r['val_nll']:.4f} | {fmt(r['var_obs'])} | {fmt(r['mean_sq_error'])} | "
                     f"{fmt(r['var_p'])} |")
    lines.append("")
    return "\n".join(lines)


def write_results(manifest: dict[str, Any], docs_dir: Path, command: str, reliability_png: Path | None) -> Path:
    docs_dir.mkdir(parents=True, exist_ok=True)
    path = docs_dir / f"{manifest['name']}.md"
    rel = reliability_png.name if reliability_png is not None else None
    path.write_text(render_results(manifest, command, rel))
    return path
