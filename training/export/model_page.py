"""Renders an exported model's results page (``docs/results/<name>.md``) from its manifest."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from artifact.contract import Manifest, Ood, Provenance
from training.export.backbone_accuracy import TEST_SPLIT, backbone_warning
from training.posthoc.decision_figures import decisions_section


def _pct(value: float) -> str:
    return f"{100 * value:.2f}%"


def _row(name: str, m: dict[str, Any]) -> str:
    low, high = m["ece_ci95"]
    return f"| {name} | {_pct(m['accuracy'])} | {_pct(m['ece'])} [{_pct(low)}, {_pct(high)}] | {m['nll']:.4f} |"


def _cell(values: dict[str, float], key: str) -> str:
    return f"{values[key]:.4f}" if key in values else "-"


def _minutes(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds / 60:.1f} min"


def _extras(manifest: Manifest) -> dict[str, Any]:
    """What the exporter records in the provenance beyond the contract's fields: stage times, the fits of the noise
    scale and the temperature, the rollout diagnostics, the step statistics and the distillation history."""
    return _provenance(manifest).model_extra or {}


def _provenance(manifest: Manifest) -> Provenance:
    if manifest.provenance is None:
        raise ValueError(f"{manifest.name} v{manifest.version}: a results page needs the manifest's provenance")
    return manifest.provenance


def _test_metrics(manifest: Manifest) -> dict[str, Any]:
    return _provenance(manifest).test_metrics or {}


def _served_score(ood: Ood) -> str | None:
    """The OOD score the exporter chose (its label, e.g. a combination's), else the manifest's score."""
    return ood.selection_choice if "selection_choice" in ood.model_fields_set else ood.score


def _sampling_choice(manifest: Manifest) -> list[str]:
    """How the default sample count and the served temperature were chosen (both on validation)."""
    s = manifest.sampling.default_samples
    lines: list[str] = []
    # DIRECTOR's table: a post-hoc path's samples are one row repeated
    table = (_provenance(manifest).default_samples_nll or {}) if manifest.method == "director" else {}
    shifted = (_extras(manifest).get("noise_shape_fit") or {}).get("default_samples_nll_shifted") or {}
    if table:
        reference = max(table)
        whose = ("NLL on validation and on the held-out shift the noise was shaped on is, on each," if shifted
                 else "validation NLL is")
        lines += [f"Default sample count **S={s}**: the smallest S whose {whose} within two standard errors "
                  f"of S={reference}'s (paired per-input differences):", "",
                  "| S | validation NLL | minus the reference | standard error |"
                  + (" shift NLL | minus the reference | standard error |" if shifted else ""),
                  "| --- | --- | --- | --- |" + (" --- | --- | --- |" if shifted else "")]
        for k, v in sorted(table.items()):
            row = f"| {k} | {v.nll:.4f} | {v.minus_reference:+.4f} | {v.stderr:.4f} |"
            if shifted:
                w = shifted[str(k)]
                row += f" {w['nll']:.4f} | {w['minus_reference']:+.4f} | {w['stderr']:.4f} |"
            lines.append(row)
        lines.append("")
    fit = _extras(manifest).get("temperature_fit") or {}
    if fit and "shift_nll_t1" in fit:  # the noise was shaped on the held-out shift: the temperature follows its rule
        clean_t = fit["temperature_clean"]
        lines += [f"Served temperature **{manifest.temperature:.3f}**: between T={clean_t:.3f} (fitted on "
                  f"validation) and 1, the one with the lower NLL on the held-out shift among those within two "
                  f"standard errors of the better validation NLL (validation {fit['clean_nll_fitted']:.4f} against "
                  f"{fit['clean_nll_t1']:.4f}, shift {fit['shift_nll_fitted']:.4f} against {fit['shift_nll_t1']:.4f})"
                  ": a temperature fitted on clean inputs alone would sharpen what the noise was shaped to soften.", ""]
    elif "temperature_first_half" in fit:
        kept = manifest.temperature
        lines += [f"Served temperature **{kept:.3f}**: fitted on the first half of validation "
                  f"(T={fit['temperature_first_half']:.3f}), it moved the second half's NLL from {fit['nll_t1']:.4f} "
                  f"to {fit['nll_fitted']:.4f}, so it is " + ("kept (refitted on all of validation)." if kept != 1.0
                                                               else "not served."), ""]
    return lines + _temperature_by_score(manifest, fit.get("by_score"))


def _temperature_by_score(manifest: Manifest, fit: dict[str, Any] | None) -> list[str]:
    """How the slope of the temperature per input was chosen, every slope's NLLs (none when it was not tried)."""
    if not fit:
        return []
    if "not_fitted" in fit:
        return [f"No temperature per input: {fit['not_fitted']}.", ""]
    terms = " + ".join(f"{t['weight']:g} x z({'log ' if t['log'] else ''}{t['score']})" for t in fit["terms"])
    verdict = (f"served: each input's logits are divided by {manifest.temperature:.3f} x exp({fit['slope']:g} x "
               f"max(0, {terms}))" if fit["slope"] else "not served: no slope beat 0 there")
    lines = [f"Temperature per input ({fit['fitted_on']}; docs/method.md, \"A temperature that follows the OOD "
             f"score\"): among the slopes whose validation NLL is within two standard errors of the best, the one "
             f"with the lowest NLL on the shift, **{fit['slope']:g}**, {verdict}.", "",
             "| slope | validation NLL | minus the best | standard error | shift NLL |",
             "| --- | --- | --- | --- | --- |"]
    lines += [f"| {k} | {v['clean_nll']:.4f} | {v['clean_minus_best']:+.4f} | {v['clean_stderr']:.4f} | "
              f"{v['shift_nll']:.4f} |" for k, v in fit["fit"].items()]
    return [*lines, ""]


def _served_against_features(manifest: Manifest) -> list[str]:
    """A line per reported set: the served score's test AUROC against the best feature-space score's (none when the
    artifact carries no feature scores)."""
    from models.uncertainty import FEATURE_SCORES

    served = _served_score(manifest.ood)
    out = []
    for name, block in _test_metrics(manifest)["ood"].items():
        features = {f: block["auroc_vs_test"][f] for f in FEATURE_SCORES if f in block["auroc_vs_test"]}
        if not features or served not in block["auroc_vs_test"]:
            continue
        best = max(features, key=features.get)
        mine = block["auroc_vs_test"][served]
        out.append(f"- {name}: served {served} {mine:.4f} against the best feature score ({best}) "
                   f"{features[best]:.4f}: {'at least as good' if mine >= features[best] else 'lower'}")
    return ["The served score against the free detectors on the same backbone (test AUROC):", "", *out, ""] \
        if out else []


def _header(manifest: Manifest, command: str) -> list[str]:
    """Where the version came from: the command, the commit, the config and the stage times."""
    prov, secs = _provenance(manifest), _extras(manifest)["seconds"]
    parameters = manifest.artifact.parameters if manifest.artifact is not None else None
    return [
        f"# {manifest.name} v{manifest.version}: results",
        "",
        f"Produced {prov.date} from commit `{prov.git_commit}` with:",
        "",
        "```bash",
        command,
        "```",
        "",
        f"Config `{prov.config}`, seed {prov.seed}, dataset {prov.dataset}. "
        f"Stage times: fit-backbone {_minutes(secs['fit_backbone'])}, distil {_minutes(secs['distil'])}, "
        f"export (with the evaluation below) {_minutes(secs['export'])}.",
        "",
        f"Backbone: {(prov.backbone or {})['parameters']:,} parameters; "
        + (f"DIRECTOR artifact: {parameters:,} parameters ({manifest.sampling.depth} steps, one DiT block)."
           if manifest.method == "director" else
           f"hybrid artifact: {parameters:,} parameters (the backbone's own forward, and the DIRECTOR kernel beside "
           "it teacher-forced on the backbone's states for its error)."
           if manifest.method == "hybrid" else
           f"post-hoc artifact: {parameters:,} parameters (the backbone's own forward and the scores it serves; the "
           "DIRECTOR kernel stays in the run folder)."),
        "",
    ]


def _test_split(manifest: Manifest) -> list[str]:
    """The backbone, its temperature-scaled copy, DIRECTOR as it would be served and the post-hoc path on the test
    split (a manifest exported before the verdict has no post-hoc row)."""
    tm = _test_metrics(manifest)
    s = tm.get("director_default_samples", manifest.sampling.default_samples)
    backbone, ts = tm["backbone"], tm["backbone_temperature_scaled"]
    served = " (served)" if manifest.method == "director" else ""
    temperature = (f", served temperature {manifest.temperature:.3f}"
                   if manifest.method == "director" and manifest.temperature != 1.0 else "")
    return [
        f"## Test split ({backbone['n']:,} {'sentences' if manifest.modality == 'text' else 'images'})",
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
        _row(f"DIRECTOR, S={s}{temperature}{served}", tm[f"director_s{s}"]),
        *([_row("post-hoc path: the backbone with the same post-hoc tools"
                + (" (served)" if manifest.method == "posthoc" else ""), tm["posthoc"])] if "posthoc" in tm else []),
        *([_row("hybrid: the backbone's labels, the kernel's error beside them"
                + (" (served)" if manifest.method == "hybrid" else ""), tm["hybrid"])] if "hybrid" in tm else []),
        "",
        *([f"Labels equal to the backbone's own on the test split: {_agreement(tm)}.", ""] if "hybrid" in tm else []),
    ]


def _agreement(tm: dict[str, Any]) -> str:
    return ", ".join(f"{name} {100 * tm[name]['label_agreement_with_backbone']:.2f}%" for name in ("hybrid", "posthoc")
                     if "label_agreement_with_backbone" in tm.get(name, {}))


def _served_block(manifest: Manifest) -> dict[str, Any]:
    """The served path's test figures: the post-hoc path's, or DIRECTOR's at its default S."""
    tm = _test_metrics(manifest)
    if manifest.method in ("posthoc", "hybrid"):
        return tm[manifest.method]
    return tm[f"director_s{tm.get('director_default_samples', manifest.sampling.default_samples)}"]


def verdict_section(manifest: Manifest) -> list[str]:
    """What the kernel adds on this model: the verdict's sentence and paired comparisons, and the test split's paired
    difference of DIRECTOR and the post-hoc path (none for a manifest exported before the verdict existed)."""
    verdict = manifest.kernel_verdict
    if verdict is None:
        return []
    scaled = {"ece", "fpr95", "accuracy"}
    # a manifest exported before the accuracy joined the verdict keeps its page's words
    points = ("ECE, FPR95 and accuracy" if any(c.metric == "accuracy" for c in verdict.comparisons)
              else "ECE and FPR95")
    test_read = ("the verdict reads its accuracy alone, so that a DIRECTOR less accurate than its backbone is not "
                 "served by auto" if any(c.set == TEST_SPLIT for c in verdict.comparisons) else "never used to decide")
    lines = ["## What the kernel adds: DIRECTOR against the post-hoc path", "", verdict.sentence, "",
             "Each row is DIRECTOR as it would be served minus the post-hoc path (the backbone's own forward with the "
             "same post-hoc tools: its own temperature rule and OOD score, chosen by the same rules), paired per "
             f"input, with a 95% interval (docs/method.md, \"The kernel earns its place, or steps aside\"). {points} "
             "in points. A difference counts only beyond noise and beyond its practical margin, in either direction; "
             "a gain counts for the kernel on the measures marked *.", "",
             "| set | measure | DIRECTOR | post-hoc | difference [95% CI] | beyond noise for | practical margin |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for c in verdict.comparisons:
        k = 100.0 if c.metric in scaled else 1.0
        outcome = " (gain)" if c.practical else " (loss)" if c.material_loss else ""
        margin = "-" if c.margin is None else f"{k * c.margin:.4g}{outcome}"
        measure = c.metric + ("*" if c.counts_for_kernel else "")
        lines.append(f"| {c.set} | {measure} | {k * c.director:.4f} | {k * c.posthoc:.4f} | "
                     f"{k * c.difference:+.4f} [{k * c.ci95[0]:+.4f}, {k * c.ci95[1]:+.4f}] | {c.favours} | "
                     f"{margin} |")
    for pair in verdict.pairs:
        lines += ["", f"{pair.richer} against {pair.cheaper} ({pair.richer} minus {pair.cheaper}, paired as above): "
                  f"{pair.sentence}.", "", f"| set | measure | {pair.richer} | {pair.cheaper} | difference [95% CI] | "
                  "beyond noise for | practical margin |", "| --- | --- | --- | --- | --- | --- | --- |"]
        for c in pair.comparisons:
            k = 100.0 if c.metric in scaled else 1.0
            outcome = " (gain)" if c.practical else " (loss)" if c.material_loss else ""
            margin = "-" if c.margin is None else f"{k * c.margin:.4g}{outcome}"
            lines.append(f"| {c.set} | {c.metric + ('*' if c.counts_for_richer else '')} | {k * c.richer:.4f} | "
                         f"{k * c.cheaper:.4f} | {k * c.difference:+.4f} [{k * c.ci95[0]:+.4f}, {k * c.ci95[1]:+.4f}] "
                         f"| {c.favours} | {margin} |")
    paired = _test_metrics(manifest).get("director_minus_posthoc")
    if paired:
        lines += ["", f"On the test split ({test_read}), DIRECTOR minus post-hoc, paired bootstrap: "
                  + ", ".join(f"{name} {100 * v['difference']:+.2f} points [{100 * v['ci95'][0]:+.2f}, "
                              f"{100 * v['ci95'][1]:+.2f}]" if name != "nll" else
                              f"NLL {v['difference']:+.4f} [{v['ci95'][0]:+.4f}, {v['ci95'][1]:+.4f}]"
                              for name, v in paired.items()) + "."]
    return [*lines, ""]


def _uncertainty_and_ood(manifest: Manifest) -> list[str]:
    """Mutual information, the chosen OOD score against every reported score, and the thresholds."""
    tm, s, ood = _test_metrics(manifest), manifest.sampling.default_samples, manifest.ood
    director = _served_block(manifest)
    # the reported scores (logit, per-input, the best combination); every candidate's validation AUROC is in the
    # manifest's ood.selection_auroc
    columns = list(next(iter(tm["ood"].values()))["auroc_vs_test"])
    lines = [
        "## Uncertainty and OOD",
        "",
        f"Mean mutual information (nats, S={s}): test split {director.get('mean_mutual_information', 0.0):.2e}, "
        + ", ".join(f"{name} {v['mean_mutual_information']:.2e}" for name, v in tm["ood"].items()) + ".",
        "",
        f"The manifest's OOD score is **{_served_score(ood)}** (fallback "
        f"**{ood.fallback_score}** where it is undefined), chosen on the OOD-validation families "
        f"({ood.selection_set}), none of them a reported set, by "
        f"{(ood.model_extra or {}).get('selection_rule', 'AUROC')}; the first row is the mean over the families:",
        "",
        "| score | " + " | ".join(columns) + " |",
        "| --- | " + " | ".join("---" for _ in columns) + " |",
        "| AUROC, OOD validation | " + " | ".join(_cell(ood.selection_auroc or {}, c) for c in columns) + " |",
        *(f"| AUROC, OOD validation: {name} | " + " | ".join(_cell(family["auroc"], c) for c in columns) + " |"
          for name, family in ((ood.model_extra or {}).get("selection_families") or {}).items()),
    ]
    for name, block in tm["ood"].items():
        lines.append(f"| AUROC, test vs {name} | " + " | ".join(_cell(block["auroc_vs_test"], c) for c in columns)
                     + " |")
    return lines + [
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
            f"S={k}: {v.score} > {v.threshold:.4g}" for k, v in ood.thresholds.items()) + ".",
        "",
    ]


def _noise_shape(manifest: Manifest, extras: dict[str, Any]) -> list[str]:
    """The token correlation of the sampled noise and how it was fitted (nothing for the diagonal Gaussian)."""
    rho, fit = manifest.sampling.token_correlation, extras.get("noise_shape_fit")
    if not rho and not fit:
        return []
    line = (f"Token correlation of the sampled noise (docs/method.md, \"Samples that carry information\"): "
            f"**{rho or 0:g}**")
    if fit:
        chosen = fit["grid"][f"rho={rho or 0:g} scale={manifest.sampling.noise_scale:g}"]
        shifted = "" if chosen["shifted_nll"] is None else f", held-out shift NLL {chosen['shifted_nll']:.4f}"
        line += (f", fitted with the noise temperature over {len(fit['grid'])} grid points on {fit['fitted_on']}: "
                 "the lowest NLL on the shift among the points whose validation NLL is within two standard errors of "
                 f"the best (validation NLL {chosen['clean_nll']:.4f}{shifted})")
    return ["", line + "."]


def _observed_process(manifest: Manifest) -> list[str]:
    """Tau, the noise temperature and, per diffused step, the floor, the observed and the predicted variance."""
    extras, variance = _extras(manifest), manifest.variance
    if variance is None:
        raise ValueError(f"{manifest.name} v{manifest.version}: a DIRECTOR manifest records its variance")
    noise_nll = extras["noise_scale_nll"]
    lines = [
        "## The observed process and the kernel",
        "",
        f"Observed variance: `{variance.observed_variance}`, tau = {variance.tau} "
        "(the largest value on the grid whose S=1 sampled observed process keeps validation accuracy within "
        "1 point of the backbone). S=1 validation accuracy by tau: "
        + ", ".join(f"{k}: {_pct(v)}" for k, v in (variance.tau_selection_accuracy or {}).items()) + ".",
        "",
        "Noise temperature (a scale on every step's std, fitted on validation NLL at "
        f"S={extras.get('noise_scale_fit_samples', manifest.sampling.default_samples)}): "
        f"**{manifest.sampling.noise_scale}**"
        + (" (validation NLL by scale: " + ", ".join(f"{k}: {v:.4f}" for k, v in noise_nll.items())
           + ")." if noise_nll else " (not fitted)."),
        *_noise_shape(manifest, extras),
        "",
        "| step t | floor_t | mean raw attention variance | median predicted std / RMS(X_t) "
        "| mean predicted log-var |",
        "| --- | --- | --- | --- | --- |",
    ]
    stats, rollout = extras["step_statistics"], extras["rollout"]
    for t, floor in enumerate(variance.floors):
        lines.append(f"| {t + 1} | {floor:.3e} | {stats['raw_var_mean'][t]:.3e} | "
                     f"{rollout['median_std_over_rms'][t]:.4f} | {rollout['mean_logvar'][t]:.3f} |")
    return lines


def _distillation(manifest: Manifest) -> list[str]:
    """The distillation history, one row per epoch."""
    lines = ["", "Distillation, per epoch (validation subset; per-step values are training-epoch means):", "",
             "| epoch | L1 | L2 | val acc | val ECE | val NLL | var_obs per step | mean sq. error per step "
             "| var_p per step |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in _extras(manifest)["distil_history"]:
        fmt = lambda v: ", ".join(f"{x:.2e}" for x in v)  # noqa: E731
        lines.append(f"| {r['epoch']} | {r['l1']:.4f} | {r['l2']:.4f} | {_pct(r['val_accuracy'])} | "
                     f"{_pct(r['val_ece'])} | {r['val_nll']:.4f} | {fmt(r['var_obs'])} | {fmt(r['mean_sq_error'])} | "
                     f"{fmt(r['var_p'])} |")
    lines.append("")
    return lines


def backbone_warning_section(manifest: Manifest) -> list[str]:
    """The warning of a version less accurate than its backbone, first on the page (nothing otherwise)."""
    warning = backbone_warning(manifest.kernel_verdict)
    return [f"**Warning: less accurate than its backbone.** {warning[0].upper()}{warning[1:]}.", ""] if warning else []


def render_results(manifest: Manifest, command: str, reliability_png: str | None) -> str:
    """The page, section by section, read from the typed manifest the server reads too: what the page states is
    what the artifact carries."""
    return "\n".join([
        *_header(manifest, command),
        *backbone_warning_section(manifest),
        *_test_split(manifest),
        *_sampling_choice(manifest),
        *verdict_section(manifest),
        *decisions_section(_test_metrics(manifest).get("decisions"), manifest.modality),
        *([f"![reliability diagram]({reliability_png})", ""] if reliability_png else []),
        *_uncertainty_and_ood(manifest),
        *(_observed_process(manifest) if manifest.variance is not None else []),
        *_distillation(manifest),
    ])


def write_results(manifest: Manifest, docs_dir: Path, command: str, reliability_png: Path | None) -> Path:
    docs_dir.mkdir(parents=True, exist_ok=True)
    path = docs_dir / f"{manifest.name}.md"
    rel = reliability_png.name if reliability_png is not None else None
    path.write_text(render_results(manifest, command, rel))
    return path
