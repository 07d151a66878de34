"""The generated part of docs/benchmarks.md: tables from the results JSON (and the marker that keeps the
hand-written part of every benchmark page).

Everything from the ``ANALYSIS_MARKER`` line on is written by hand and kept as it is when the tables are
rewritten (a file without the marker gets one, with a placeholder, after the tables)."""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

# an open-loop run whose generator lags more than this behind its schedule measured the client, not the server
GENERATOR_LAG_LIMIT_MS = 50.0
ANALYSIS_MARKER = "<!-- analysis: written by hand below this line; --markdown keeps it -->"


def _ms(row: dict[str, Any], prefix: str = "") -> str:
    return " / ".join(str(row.get(f"{prefix}p{q}_ms")) for q in (50, 95, 99))


def load_section(results: dict[str, Any]) -> list[str]:
    s = results["n_samples"]
    # the forward timed raw: the one the server calls (runs before it was recorded timed sample_rows)
    raw_method = next((x["method"] for x in results.get("raw_artifact", []) if "method" in x), "sample_rows")
    lines = [
        "Command (one run measures both modes, the overload and the raw artifact):", "", "```bash",
        results["command"], "```", "",
        f"Model `{results['model']}`, one input per request, n_samples = {s}, torch {results['torch']}, "
        f"{results['cpu_count']} CPU cores. The server's torch threads are pinned to {results['threads']}; the async "
        "load generator runs on the same machine, on loopback. `batching`: `max_batch_samples` "
        f"{results['max_batch_samples']}, `max_batch_delay_ms` {results['max_batch_delay_ms']:g}. `batch-1`: "
        f"`max_batch_samples` {s} (one request per forward), no delay. Raw: `{raw_method}` of the TorchScript "
        "artifact alone, same thread count.", "",
        "| clients | batching rps | p50 / p95 / p99 ms | batch-1 rps | p50 / p95 / p99 ms |",
        "| --- | --- | --- | --- | --- |",
    ]
    for a, b in zip(results["runs"]["batching"], results["runs"]["batch-1"], strict=True):
        lines.append(f"| {a['concurrency']} | {a['throughput_rps']} | {_ms(a)} | {b['throughput_rps']} | {_ms(b)} |")
    over = results.get("overload")
    if over is not None and "offered_rps" in over:
        lines += ["", f"Overload (open loop, Poisson arrivals at {over['factor']:g}x the capacity measured above, "
                  f"{over['capacity_rps']} rps -> {over['offered_rps']} rps offered, `max_queue` {over['max_queue']}, "
                  f"{over['seconds']} s): status codes {over['codes']}, transport errors {over['transport_errors']}; "
                  f"refused p50 / p95 / p99 {_ms(over, 'refused_')} ms; served {over['ok']} at p50 / p95 / p99 "
                  f"{_ms(over)} ms; generator lag p99 {over.get('generator_lag_p99_ms')} ms."]
    elif over is not None:  # results written before the open-loop overload run
        lines += ["", f"Overload: {over['concurrency']} clients against `max_queue` {over['max_queue']}: status codes "
                  f"{over['codes']}, served p99 {over['p99_ms']} ms, refused p99 {over['refused_p99_ms']} ms."]
    flood = results.get("flood")
    if flood is not None:
        lines += ["", f"Flood (closed loop: {flood['concurrency']} clients sending back to back, a refused client "
                  f"retrying at once, `max_queue` {flood['max_queue']}): status codes {flood['codes']}; refused p50 / "
                  f"p95 / p99 {_ms(flood, 'refused_')} ms; served p50 / p95 / p99 {_ms(flood)} ms."]
    lines += ["", "| raw artifact: S | batch (inputs) | rows per forward | ms per forward | inputs/s |",
              "| --- | --- | --- | --- | --- |"]
    lines += [f"| {x.get('n_samples', s)} | {x['batch']} | {x['batch'] * x.get('n_samples', s)} | "
              f"{x['ms_per_forward']} | {x['inputs_per_s']} |" for x in results["raw_artifact"]]
    return lines


def raw_gain(results: dict[str, Any], n_samples: int, max_rows: int) -> tuple[float, float] | None:
    """(best raw inputs/s with at most ``max_rows`` rows per forward, that over batch 1's): what batching can
    gain inside the forward at this sample count."""
    rows = [x for x in results.get("raw_artifact", []) if x.get("n_samples", results["n_samples"]) == n_samples]
    single = next((x["inputs_per_s"] for x in rows if x["batch"] == 1), None)
    within = [x["inputs_per_s"] for x in rows if x["batch"] * n_samples <= max_rows]
    if single is None or not within:
        return None
    return max(within), max(within) / single


def targets_section(results: dict[str, Any]) -> list[str]:
    """The CPU performance targets, each computed from this run's own figures."""
    lines = ["## Targets (from the figures above)", "", "| target | measured | met |", "| --- | --- | --- |"]
    runs = results.get("runs", {})
    at = {mode: {r["concurrency"]: r for r in rows} for mode, rows in runs.items()}
    s, max_rows = results["n_samples"], results["max_batch_samples"]
    checks: list[tuple[int, float | None, float | None, bool]] = [
        (s, at.get("batching", {}).get(32, {}).get("throughput_rps"),
         at.get("batch-1", {}).get(32, {}).get("throughput_rps"), True)]
    budget = results.get("budget", {})
    peak = {p["batching"]: p["throughput_rps"] for p in budget.get("peak") or []}
    if peak:  # its peaks beside the raw artifact's figures only when one command measured both
        checks.append((1, peak.get("batching"), peak.get("batch-1"), budget.get("command") == results.get("command")))
    for n, batched, single, same_run in checks:
        gain = raw_gain(results, n, max_rows) if same_run else None
        if batched and single:
            ceiling = f"; the raw artifact itself gains {gain[1]:.2f}x from batch 1 to its best batch" if gain else ""
            lines.append(f"| batching >= 4x batch-1 at 32 clients, S = {n} | {batched / single:.2f}x "
                         f"({batched} vs {single} rps{ceiling}) | {'yes' if batched / single >= 4 else 'no'} |")
        if batched and gain:
            overhead = gain[0] / batched - 1
            lines.append(f"| HTTP + batching overhead <= 25% of raw artifact time, S = {n}, 32 clients | "
                         f"{overhead:.0%} (served {batched} rps vs raw {gain[0]} inputs/s at <= {max_rows} rows) | "
                         f"{'yes' if overhead <= 0.25 else 'no'} |")
    over = results.get("overload")
    if over is not None and "offered_rps" in over:
        p99 = over.get("refused_p99_ms")
        only = set(over["codes"]) <= {"200", "503"} and over["transport_errors"] == 0
        lag = over.get("generator_lag_p99_ms")
        if lag is not None and lag > GENERATOR_LAG_LIMIT_MS:  # latencies count from the scheduled arrival
            verdict = f"not measured: the load generator fell behind its schedule (lag p99 {lag} ms)"
        else:
            verdict = "yes" if p99 is not None and p99 < 50 and only else "no"
        lines.append(f"| at {over['factor']:g}x capacity the excess is refused in < 50 ms p99, no error but 503 | "
                     f"refused p99 {p99} ms; codes {over['codes']}, transport errors {over['transport_errors']} | "
                     f"{verdict} |")
    return lines


def repeated(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per subject over the repeats: the median and range of its max rps, and of its ratio to the deterministic model
    measured in the same repeat and mode (paired, so a machine that slows between repeats slows both)."""
    plain = {(r["repeat"], r["batching"]): r.get("max_rps") for r in rows if r["method"] == "deterministic"}
    out = []
    for key in dict.fromkeys((r["label"], r["n_samples"], r["batching"]) for r in rows):
        mine = [r for r in rows if (r["label"], r["n_samples"], r["batching"]) == key]
        rates = [r["max_rps"] for r in mine if r.get("max_rps")]
        ratios = [r["max_rps"] / plain[(r["repeat"], r["batching"])] for r in mine
                  if r.get("max_rps") and plain.get((r["repeat"], r["batching"]))]
        out.append({"label": key[0], "n_samples": key[1], "batching": key[2], "repeats": len(mine),
                    "max_rps": spread(rates), "vs_deterministic": spread(ratios)})
    return out


def spread(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3),
            "max": round(max(values), 3)}


def repeat_of(run: dict[str, Any]) -> str:
    return f" (repeat {run['repeat'] + 1})" if "repeat" in run else ""


def budget_section(budget: dict[str, Any]) -> list[str]:
    rows = budget["rows"]
    many = budget.get("repeats", 1) > 1
    base = {(r.get("repeat", 0), r["batching"]): r.get("max_rps") for r in rows if r["method"] == "deterministic"}
    lines = [
        f"## Requests per second under a {budget['budget_ms']:g} ms p99 budget", "", "```bash", budget["command"],
        "```", "",
        f"Models `{budget['models']['director']}` (DIRECTOR) and `{budget['models']['deterministic']}` (the plain "
        "backbone exported by `python -m training export-baseline --method deterministic`, one forward, S = 1) in "
        f"one model repository, served by the same server ({budget['threads']} torch thread). Open loop: Poisson "
        f"arrivals at a fixed rate for {budget['point_seconds']:g} s per point, latency from each scheduled arrival; "
        "the rate is doubled until a point fails, then bisected "
        f"{budget['search_steps']} times"
        + ("; the subjects one server serves take turns, a point each" if budget.get("search") == "interleaved"
           else "") +
        ". A point passes when every request got 200 and the p99 is within the "
        f"budget. `batching`: `max_batch_samples` {budget['max_batch_samples']}, no delay; `batch-1`: "
        "`max_batch_samples` 1 (one request per forward, S = 1 only).", "",
        f"| model | S | mode | max rps (p99 <= {budget['budget_ms']:g} ms) | p50 / p95 / p99 ms there | "
        "vs deterministic (same mode) |" + (" repeat |" if many else ""),
        "| --- | --- | --- | --- | --- | --- |" + (" --- |" if many else ""),
    ]
    for r in rows:  # with repeats: every search, in the order run; the ratio is to the same repeat's
        plain = base.get((r.get("repeat", 0), r["batching"]))
        ratio = f"{r['max_rps'] / plain:.2f}x" if plain and r.get("max_rps") else "-"
        rps = r["max_rps"] if r.get("max_rps") is not None else "none passed"
        repeat = f" {r['repeat'] + 1} |" if many else ""
        lines.append(f"| {r['label']} | {r['n_samples']} | {r['batching']} | {rps} | {_ms(r)} | {ratio} |{repeat}")
    if many:
        lines += ["", f"Over the {budget['repeats']} repeats (each a full search on a fresh server; the ratio is "
                  "paired with the deterministic model's search of the same repeat and mode):", "",
                  "| model | S | mode | max rps: median [min, max] | spread (max / min) | vs deterministic: median "
                  "[min, max] |", "| --- | --- | --- | --- | --- | --- |"]
        for r in budget["repeated"]:
            rps, vs = r["max_rps"], r["vs_deterministic"]
            rate = f"{rps['median']} [{rps['min']}, {rps['max']}]" if rps else "none passed"
            width = f"{rps['max'] / rps['min']:.2f}x" if rps else "-"
            ratio = f"{vs['median']:.2f}x [{vs['min']:.2f}, {vs['max']:.2f}]" if vs else "-"
            lines.append(f"| {r['label']} | {r['n_samples']} | {r['batching']} | {rate} | {width} | {ratio} |")
    peak = budget.get("peak") or []
    if peak:
        lines += ["", f"Batching at S = 1, peak throughput with {budget['peak_clients']} closed-loop clients:", "",
                  "| mode | rps | p50 / p95 / p99 ms |", "| --- | --- | --- |"]
        lines += [f"| {p['batching']}{repeat_of(p)} | {p['throughput_rps']} | {_ms(p)} |" for p in peak]
    return lines


def write_markdown(results: dict[str, Any], path: Path, json_path: Path | None = None) -> None:
    """Rewrite the tables of ``path``; keep the hand-written analysis after the marker."""
    device = results.get("device", "cpu")
    where = "CPU, this machine" if device == "cpu" else f"{device}{', bf16' if results.get('bf16') else ', fp32'}"
    lines = [f"# Serving benchmark ({where})", ""]
    if "runs" in results:
        lines += load_section(results)
    if "budget" in results:
        lines += ["", *budget_section(results["budget"])]
    if "runs" in results:
        lines += ["", *targets_section(results)]
    where_json = f"`{json_path.as_posix()}`" if json_path is not None else "the results JSON"
    lines += ["", f"Every number above is also in {where_json}; the tables are what `--markdown` wrote."]
    write_keeping_analysis(path, lines)


def store_entry(out: Path, markdown: Path | None, key: str, results: dict[str, Any], title: str,
                section: Callable[[dict[str, Any]], list[str]]) -> None:
    """Put ``results`` under ``key`` in the JSON file ``out`` (its other entries kept) and, with ``markdown``, write the
    page of every entry: ``title``, then each entry's ``section``, the hand-written analysis kept."""
    stored = json.loads(out.read_text()) if out.exists() else {}
    stored[key] = results
    out.write_text(json.dumps(stored, indent=2) + "\n")
    if markdown is not None:
        sections = [line for entry in stored.values() for line in [*section(entry), ""]]
        write_keeping_analysis(markdown, [title, "", *sections[:-1]])


def write_keeping_analysis(path: Path, generated: list[str]) -> None:
    """Write the ``generated`` lines to ``path``, then its hand-written part from the marker on (kept as it is)."""
    kept = f"{ANALYSIS_MARKER}\n\n## What this shows\n\n(analysis to be written)\n"
    if path.exists():
        text = path.read_text()
        if ANALYSIS_MARKER in text:
            kept = text[text.index(ANALYSIS_MARKER):]
    path.write_text("\n".join(generated) + "\n\n" + kept)


def export_table(results: dict[str, Any]) -> list[str]:
    """``benchmarks/export_ab.py``'s results as a table: each point's times in both formats and their paired ratio."""
    lines = ["| method | inputs x S | TorchScript ms (min-max) | AOTI ms (min-max) | TorchScript inputs/s | "
             "AOTI inputs/s | AOTI / TorchScript time (range) |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for row in results["rows"]:
        ts, ao = row["torchscript"], row["aoti"]
        lines.append(f"| {row['method']} | {row['inputs']} x {row['n_samples']} | {ts['ms_median']} "
                     f"({ts['ms_min']}-{ts['ms_max']}) | {ao['ms_median']} ({ao['ms_min']}-{ao['ms_max']}) | "
                     f"{ts['inputs_per_s']} | {ao['inputs_per_s']} | {row['ratio_median']} "
                     f"({row['ratio_range'][0]}-{row['ratio_range'][1]}) |")
    return lines
