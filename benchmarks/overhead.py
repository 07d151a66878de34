"""The server's HTTP + batching overhead: requests per second that 32 closed-loop clients get from the server, against
the inputs per second the artifact's own forward computes alone, at S = 1 and S = 16, for one or more source trees
(two commits, for an A/B) interleaved round by round.

    .venv/bin/python -m benchmarks.overhead --tree /tmp/before --tree . --rounds 3 \\
        --out docs/benchmarks-overhead.json --markdown docs/benchmarks-overhead.md

- Served: each tree's ``python -m service`` (its own ``service`` package: the tree is the server's working directory)
  on a repository holding only ``--model``/``--version`` of this checkout, torch pinned to ``--threads``, default
  batching (``max_batch_samples`` 128, no delay); ``benchmarks.loadgen``'s closed loop (pre-encoded requests on raw
  asyncio streams: the cheapest client this project has, since it shares the cores with the server) sends one image
  as a JSON pixel list per request, ``return_probabilities`` false.
- Raw: the forward the server calls for that version (``scored_rows`` when its OOD score reads per-input scores, else
  ``sample_rows``), loaded in this process with the same thread count, at the batch sizes the served run can form
  (1, 8 and 32 inputs; at most ``max_batch_samples`` rows); the best inputs/s of them, measured right after each
  served run (this machine's speed drifts by tens of percent over minutes).
- Overhead = raw inputs/s over served requests/s, minus 1, per round and tree (each with its own raw figure); the
  page reports each tree's median and range, and the median of the paired ratios (tree over the first tree, round by
  round).
- The worker's side of the same seconds, from the server's own ``/metrics`` read before and after each run: how busy
  its batch worker was, the batch size the clients formed, and the served rate against the worker's own batches
  (``worker_figures``); and the load generator's own CPU per request.
- ``--folder`` (repeat it) serves other version folders instead of ``--model``/``--version``, each as a subject of its
  own: a version and its AOTInductor copy (``python -m training.export.torch_export_version``), for a served A/B of
  the two formats:

    .venv/bin/python -m benchmarks.overhead --folder model_repository/fashion-vit/6 \\
        --folder /tmp/fashion-vit-aoti/6 --rounds 4 --seconds 6
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import torch
from prometheus_client.parser import text_string_to_metric_families

from artifact.contract import parse_manifest, read_document
from artifact.formats import AOTI_FORMAT, TORCHSCRIPT_FORMAT, artifact_format
from benchmarks.loadgen import closed_loop, encode_post
from benchmarks.report import spread, write_keeping_analysis
from benchmarks.server import ROOT, server_process
from benchmarks.timing import raw_forward

MAX_BATCH_SAMPLES = 128  # the server's CPU default


def commit_of(tree: Path) -> str:
    """``tree``'s commit (with ``+changes`` when its working tree differs from it)."""
    head = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(tree), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True, check=True).stdout.strip()
    return head + ("+changes" if dirty else "")


def one_version_repository(folder: Path, model: str, version: str, into: Path) -> Path:
    """A repository holding only a copy of ``model``/``version`` (the server refuses symlinks out of its repository):
    the servers load nothing else."""
    shutil.copytree(folder, into / model / version)
    return into


def best_raw(folder: Path, n_samples: int, threads: int, min_seconds: float) -> dict[str, Any]:
    """The best inputs/s of the server's forward over the batch sizes a served run of 32 clients can form."""
    batches = [b for b in (1, 8, 32) if b == 1 or b * n_samples <= MAX_BATCH_SAMPLES]
    rows = raw_forward(folder, n_samples, batches, threads, min_seconds)
    best = max(rows, key=lambda row: row["inputs_per_s"])
    return {"method": best["method"], "inputs_per_s": best["inputs_per_s"], "batch": best["batch"],
            "by_batch": {str(row["batch"]): row["inputs_per_s"] for row in rows}}


def served(tree: Path, repository: Path, model: str, body: dict[str, Any], samples: list[int], clients: int,
           seconds: float, threads: int) -> dict[int, dict[str, Any]]:
    """Closed-loop requests/s of ``tree``'s server at each sample count (one server start for all of them), with the
    server's CPU per request and what its batch worker did over the same seconds (``worker_figures``)."""
    out = {}
    with server_process(repository, model, threads, [], root=tree) as (proc, url):
        for s in samples:
            raw = encode_post(url, "/predict", {**body, "n_samples": s})
            asyncio.run(closed_loop(url, raw, clients, 10**9, 2.0))  # warm-up: connections, caches, the first batches
            before, worker_before, generator_before = cpu_seconds(proc.pid), worker_totals(url), own_cpu_seconds()
            run = asyncio.run(closed_loop(url, raw, clients, 10**9, seconds))
            spent, generator = cpu_seconds(proc.pid) - before, own_cpu_seconds() - generator_before
            out[s] = {key: run[key] for key in ("throughput_rps", "p50_ms", "p99_ms", "codes", "transport_errors")}
            out[s]["server_cpu_ms_per_request"] = round(spent * 1000 / max(run["ok"], 1), 4)
            out[s]["generator_cpu_ms_per_request"] = round(generator * 1000 / max(run["ok"], 1), 4)
            out[s]["worker"] = worker_figures(worker_before, worker_totals(url), run["seconds"])
    return out


WORKER_SERIES = {"director_inference_duration_seconds": "batch_seconds", "director_batch_size": "inputs"}


def worker_totals(url: str) -> dict[str, float]:
    """The server's running totals of its batch worker (``worker_totals_of`` its ``/metrics``)."""
    return worker_totals_of(httpx.get(f"{url}/metrics", timeout=10).text)


def worker_totals_of(exposition: str) -> dict[str, float]:
    """Running totals (all versions) of the batches' forward + summary seconds, inputs and batches in a Prometheus
    text exposition."""
    totals = {"batch_seconds": 0.0, "inputs": 0.0, "batches": 0.0}
    for family in text_string_to_metric_families(exposition):
        name = WORKER_SERIES.get(family.name)
        for sample in family.samples if name is not None else ():
            if sample.name == family.name + "_sum":
                totals[name] += sample.value
            elif sample.name == family.name + "_count" and name == "inputs":
                totals["batches"] += sample.value
    return totals


def worker_figures(before: dict[str, float], after: dict[str, float], wall_s: float) -> dict[str, float]:
    """What the batch worker did during a run of ``wall_s`` seconds: the share of the run it spent in batches (forward
    and summaries), the inputs per batch it formed, and the inputs per second of its own batch time. The served rate
    over that rate, minus 1, is the run's overhead measured on the same seconds as the rate it is compared with."""
    batch_s, inputs, batches = (after[key] - before[key] for key in ("batch_seconds", "inputs", "batches"))
    return {"busy": round(batch_s / wall_s, 4), "inputs_per_batch": round(inputs / max(batches, 1), 2),
            "batch_inputs_per_s": round(inputs / batch_s, 1) if batch_s > 0 else 0.0}


def own_cpu_seconds() -> float:
    """User + system CPU seconds of this process: during a closed loop, the load generator's cost (it shares the
    cores with the server)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds the process has used, all its threads (``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def summarise(results: dict[str, Any]) -> None:
    """Per tree and sample count: overhead per round, its median and range; paired ratios against the first tree."""
    trees = results["trees"]
    first = trees[0]["label"]
    summary: dict[str, Any] = {}
    for tree in trees:
        label = tree["label"]
        for s in results["samples"]:
            key = str(s)
            rounds = results["rounds"]
            rps = [r["served"][label][key]["throughput_rps"] for r in rounds]
            raw = [r["raw"][label][key]["inputs_per_s"] for r in rounds]
            overhead = [a / b - 1 for a, b in zip(raw, rps, strict=True)]
            paired = [r["served"][label][key]["throughput_rps"] / r["served"][first][key]["throughput_rps"]
                      for r in rounds]
            cpu = [r["served"][label][key]["server_cpu_ms_per_request"] for r in rounds]
            raw_ms = [1000 / x for x in raw]  # the forward's own CPU per input (one thread)
            workers = [(r["served"][label][key]["worker"], r["served"][label][key]["throughput_rps"])
                       for r in rounds if "worker" in r["served"][label][key]]
            summary.setdefault(label, {})[key] = {
                "served_rps": spread(rps), "raw_inputs_per_s": spread(raw), "overhead": spread(overhead),
                "vs_first": spread(paired), "server_cpu_ms_per_request": spread(cpu),
                "cpu_beyond_forward": spread([c / f - 1 for c, f in zip(cpu, raw_ms, strict=True)]),
                "worker_busy": spread([w["busy"] for w, _ in workers]),
                "inputs_per_batch": spread([w["inputs_per_batch"] for w, _ in workers]),
                "overhead_in_run": spread([w["batch_inputs_per_s"] / served - 1 for w, served in workers]),
                "generator_cpu_ms_per_request": spread([r["served"][label][key]["generator_cpu_ms_per_request"]
                                                        for r in rounds
                                                        if "generator_cpu_ms_per_request" in r["served"][label][key]])}
    results["summary"] = summary


def formats(results: dict[str, Any]) -> str:
    """The artifact formats the subjects served, in words (a run that recorded none served TorchScript)."""
    served = {tree.get("format", TORCHSCRIPT_FORMAT) for tree in results["trees"]}
    names = {TORCHSCRIPT_FORMAT: "TorchScript", AOTI_FORMAT: "its AOTInductor package"}
    return "served as " + " and as ".join(names[f] for f in names if f in served)


def markdown(results: dict[str, Any]) -> list[str]:
    s_list = results["samples"]
    lines = ["# Request-path overhead (CPU, this machine)", "", "```bash", results["command"], "```", "",
             f"Model `{results['model']}` version {results['version']} ({formats(results)}), one image per request "
             "as a JSON pixel list, "
             f"{results['clients']} closed-loop clients for {results['seconds']:g} s per point, "
             f"{len(results['rounds'])} rounds with the trees in alternating order, server torch threads "
             f"{results['threads']}, "
             f"{results['cpu_count']} CPU cores shared by the server and the load generator, torch "
             f"{results['torch']}, {results['date']}. Raw: `{results['method']}` alone in the benchmark's process "
             "(same threads), measured right after each server stopped, the best of 1, 8 and 32 inputs per forward "
             f"(at most {MAX_BATCH_SAMPLES} rows). Overhead = raw inputs/s / served requests/s - 1, per round.", "",
             "Server CPU: user + system seconds of the server process (all threads) over the run, per request "
             "answered; beyond the forward = that over the raw forward's time per input, minus 1 (the server's own "
             "CPU cost, less sensitive than a rate to what else the two shared cores ran).", "",
             "| tree | S | served rps, median [min, max] | raw inputs/s | overhead, median [min, max] | "
             "vs the first tree (paired) | server CPU ms / request | CPU beyond the forward |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for tree in results["trees"]:
        for s in s_list:
            row = results["summary"][tree["label"]][str(s)]
            rps, raw, over, vs = row["served_rps"], row["raw_inputs_per_s"], row["overhead"], row["vs_first"]
            cpu, beyond = row["server_cpu_ms_per_request"], row["cpu_beyond_forward"]
            lines.append(f"| {tree['label']} | {s} | {rps['median']:.1f} [{rps['min']:.1f}, {rps['max']:.1f}] | "
                         f"{raw['median']:.1f} | {over['median']:.0%} [{over['min']:.0%}, {over['max']:.0%}] | "
                         f"{vs['median']:.2f}x [{vs['min']:.2f}, {vs['max']:.2f}] | "
                         f"{cpu['median']:.3f} [{cpu['min']:.3f}, {cpu['max']:.3f}] | "
                         f"{beyond['median']:.0%} [{beyond['min']:.0%}, {beyond['max']:.0%}] |")
    worker_rows = [(tree["label"], s, results["summary"][tree["label"]][str(s)]) for tree in results["trees"]
                   for s in s_list if results["summary"][tree["label"]][str(s)].get("worker_busy")]
    if worker_rows:
        lines += ["", "What the server's batch worker did over the same seconds (from the server's own `/metrics`: "
                  "`director_inference_duration_seconds` and `director_batch_size`, read before and after each run): "
                  "the share of the run it spent in batches (forward and summaries), the inputs per batch the "
                  "closed loop formed, and the overhead measured against the worker's own batches of that run "
                  "(their inputs per second of batch time over the served requests per second, minus 1), and the "
                  "CPU the load generator itself spent per request (this process, during the run). Unlike the "
                  "column above, this figure compares two rates of the same seconds, so the machine's drift between "
                  "a served run and the raw forward after it does not enter it; it leaves out what a batch size "
                  "other than the one formed would have cost.", "",
                  "| tree | S | worker busy, median [min, max] | inputs per batch | overhead against its own batches | "
                  "load generator CPU ms / request |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for label, s, row in worker_rows:
            busy, size, own = row["worker_busy"], row["inputs_per_batch"], row["overhead_in_run"]
            generator = row.get("generator_cpu_ms_per_request")
            generator_ms = f"{generator['median']:.3f}" if generator else "-"
            lines.append(f"| {label} | {s} | {busy['median']:.0%} [{busy['min']:.0%}, {busy['max']:.0%}] | "
                         f"{size['median']:.1f} | {own['median']:.0%} [{own['min']:.0%}, {own['max']:.0%}] | "
                         f"{generator_ms} |")
    return lines


def subjects(trees: list[Path], folders: list[Path]) -> list[dict[str, str]]:
    """Every source tree serving every version folder, labelled by its position and commit, and by the folder's
    format and version when more than one folder is compared."""
    out = []
    for tree in trees:
        for folder in folders:
            manifest = parse_manifest(read_document(folder))
            kind = artifact_format(manifest.artifact)
            label = f"{len(out)}:{commit_of(tree)}"
            if len(folders) > 1:
                label += f" {kind} v{manifest.version}"
            out.append({"label": label, "path": str(tree.resolve()), "folder": str(folder.resolve()), "format": kind})
    return out


def run(args: argparse.Namespace, progress: Callable[[str], None] = print) -> dict[str, Any]:
    manifest = parse_manifest(read_document(args.folder[0]))
    shape = (manifest.input.channels, manifest.input.height, manifest.input.width)  # type: ignore[union-attr]
    pixels = np.random.default_rng(0).random(shape).round(4).tolist()
    body = {"model": args.model, "inputs": [{"pixels": pixels}], "return_probabilities": False}
    trees = subjects(args.tree, args.folder)
    results: dict[str, Any] = {
        "command": " ".join(["python -m benchmarks.overhead", *sys.argv[1:]]), "model": args.model,
        "version": manifest.version, "samples": args.samples, "clients": args.clients, "seconds": args.seconds,
        "threads": args.threads, "cpu_count": os.cpu_count(), "torch": torch.__version__,
        "date": date.today().isoformat(), "trees": trees, "rounds": []}
    with tempfile.TemporaryDirectory(prefix="director-overhead-") as tmp:
        repositories = {tree["label"]: one_version_repository(Path(tree["folder"]), args.model, manifest.version,
                                                              Path(tmp) / str(i)) for i, tree in enumerate(trees)}
        for r in range(args.rounds):
            order = trees if r % 2 == 0 else list(reversed(trees))
            entry: dict[str, Any] = {"served": {}, "raw": {}}
            for tree in order:  # the raw forward right after each tree's server: the machine's speed drifts
                label = tree["label"]
                entry["served"][label] = {str(s): v for s, v in served(
                    Path(tree["path"]), repositories[label], args.model, body, args.samples, args.clients,
                    args.seconds, args.threads).items()}
                entry["raw"][label] = {str(s): best_raw(Path(tree["folder"]), s, args.threads, args.raw_seconds)
                                       for s in args.samples}
                progress(f"round {r + 1} {label}: " + json.dumps({s: (v["throughput_rps"], entry["raw"][label][s][
                    "inputs_per_s"], v["worker"]["busy"]) for s, v in entry["served"][label].items()}))
            results["rounds"].append(entry)
    first = results["rounds"][0]["raw"]
    results["method"] = next(iter(next(iter(first.values())).values()))["method"]
    summarise(results)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=Path, action="append", help="source tree to serve from (repeat; default: .)")
    parser.add_argument("--repository", type=Path, default=ROOT / "model_repository")
    parser.add_argument("--model", default="fashion-vit")
    parser.add_argument("--version", default="6")
    parser.add_argument("--folder", type=Path, action="append",
                        help="version folder to serve (repeat to compare, e.g. a version and its AOTInductor copy; "
                             "default: the repository's --model/--version)")
    parser.add_argument("--samples", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds per served point")
    parser.add_argument("--raw-seconds", type=float, default=1.0, help="seconds per raw batch size")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="server torch threads (pinned), and the raw forward's")
    parser.add_argument("--out", type=Path, default=None, help="write the results JSON here")
    parser.add_argument("--markdown", type=Path, default=None, help="write the page here (its analysis is kept)")
    args = parser.parse_args(argv)
    args.tree = args.tree or [ROOT]
    args.folder = args.folder or [args.repository / args.model / args.version]
    results = run(args)
    print(json.dumps(results["summary"], indent=1))
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=1) + "\n")
    if args.markdown is not None:
        write_keeping_analysis(args.markdown, markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
