"""Offline scoring rates: the in-process scorer against Ray Data with 1 and 2 actors, texts and images.

``python -m benchmarks.offline_scoring [--texts 2000] [--images 12000] [--rounds 2]`` scores
``movie-reviews-minilm`` (movie-review test sentences) and ``fashion-vit`` (Fashion-MNIST test images as PNG, base64
in JSONL) from the committed ``model_repository/`` at their highest versions, each at its default sample count:

- ``in_process``: one ``Scorer`` in this process, one torch thread, chunk by chunk as ``python -m
  service.batch_scoring`` runs;
- ``ray_1`` / ``ray_2``: ``--engine ray``'s pipeline (the key survey, Ray Data's read tasks, ``map_batches`` over an
  actor pool of ``Scorer``s of one CPU and one torch thread each) on a local Ray of this machine's cores, started
  once before the runs (its start is reported apart).

Each chunk's lines carry when and by which process they were scored. ``total_rate`` counts from the scorer's
construction (for Ray: the pipeline's start, actor starts and model loads included) to the last chunk scored;
``all_running_s`` is when every scorer had scored its first chunk, and ``steady_rate`` counts the chunks scored after
that over the time they took (what a long run approaches). Every Ray run's lines are checked against the in-process
ones. The projection for a cluster is arithmetic on the measured per-actor rate, not a measurement.

``--resume-lines N`` instead scores N images on Ray in a child process, interrupts it (SIGINT) once half its lines are
written, resumes it, checks that every key is in the output exactly once, and adds that to the results in ``--out``.

Prints one JSON object, writes it to ``--out`` and the page to ``--markdown``.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch
from PIL import Image

from benchmarks.server import ROOT
from service.config import Settings
from service.scoring import Scorer
from service.scoring.inputs import Source, read_inputs
from service.scoring.ray_data import RayJob, scored_lines, start_local_ray
from service.scoring.segments import survey
from training.data.images import load_fashion_mnist_split
from training.data.texts import load_movie_reviews

MODELS = {"texts": "movie-reviews-minilm", "images": "fashion-vit"}
CHUNK = 64
PROJECTED_WORKERS = (8, 32, 128)


def text_lines(count: int) -> list[str]:
    sentences = load_movie_reviews().test.texts
    return [json.dumps({"id": f"t{i}", "text": sentences[i % len(sentences)]}) for i in range(count)]


def png_base64(pixels: np.ndarray) -> str:
    out = io.BytesIO()
    Image.fromarray(pixels, mode="L").save(out, format="PNG")
    return base64.b64encode(out.getvalue()).decode()


def image_lines(count: int) -> list[str]:
    images = (load_fashion_mnist_split("/usr/share/datasets/fashion-mnist", "test").images * 255).round()
    pixels = images.squeeze(1).to(torch.uint8).numpy()  # [10000, 28, 28]
    return [json.dumps({"id": f"i{i}", "image_base64": png_base64(pixels[i % len(pixels)])}) for i in range(count)]


class TimedScorer(Scorer):
    """A scorer whose lines say when and by which process they were scored (this benchmark's clock)."""

    def __call__(self, batch: Any) -> Any:
        scored = super().__call__(batch)
        rows = len(scored)
        return scored.append_column("scored_at", pa.array([time.time()] * rows)).append_column(
            "scorer", pa.array([os.getpid()] * rows))


def run_rates(started: float, stamps: list[tuple[float, int, int]], lines: list[dict[str, Any]]) -> dict[str, Any]:
    """From (time scored, scorer, inputs) per chunk: the total rate from ``started`` (the scorer's construction; for
    Ray the pipeline's start, actor starts and model loads) to the last chunk, when every scorer had scored its first
    chunk (all running), and the steady rate from then on (what a long run approaches: the starts left out)."""
    ended = max(at for at, _, _ in stamps)
    running = max(min(at for at, who, _ in stamps if who == scorer) for scorer in {who for _, who, _ in stamps})
    after = sum(count for at, _, count in stamps if at > running)
    return {"inputs": len(lines), "seconds": round(ended - started, 2), "all_running_s": round(running - started, 2),
            "total_rate": round(len(lines) / (ended - started), 1),
            "steady_rate": round(after / max(ended - running, 1e-9), 1), "lines": lines}


def in_process(repository: Path, model: str, source: Path) -> dict[str, Any]:
    started = time.time()
    scorer = Scorer(repository, model, settings=Settings(model_repository=repository, torch_threads=1))
    items, lines, stamps = list(read_inputs(Source(source))), [], []
    for start in range(0, len(items), CHUNK):
        lines.extend(scorer.lines(items[start:start + CHUNK]))
        stamps.append((time.time(), os.getpid(), len(items[start:start + CHUNK])))
    return run_rates(started, stamps, lines)


def on_ray(repository: Path, model: str, source: Path, actors: int, output: Path) -> dict[str, Any]:
    arguments = {"repository": repository, "model": model, "version": None, "n_samples": None, "seed": None,
                 "ask": None, "settings": Settings(model_repository=repository, torch_threads=1)}
    job = RayJob(Source(source), output, CHUNK, arguments, actors=actors)
    started, lines, stamps = time.time(), [], {}
    plan = survey(job.source, set(), CHUNK, actors)
    for chunk in scored_lines(job, plan.segments, actors, TimedScorer):
        for line in chunk:
            key = (line.pop("scored_at"), line.pop("scorer"))
            stamps[key] = stamps.get(key, 0) + 1
        lines.extend(chunk)
    return run_rates(started, [(at, who, count) for (at, who), count in stamps.items()], lines)


def modality(repository: Path, kind: str, count: int, rounds: int, work: Path) -> dict[str, Any]:
    """Every scorer ``rounds`` times, in the reverse order every other round (a drift of the machine's speed during
    the run weighs on each alike); rates are the rounds' means, each round's kept."""
    source = work / f"{kind}.jsonl"
    source.write_text("\n".join(text_lines(count) if kind == "texts" else image_lines(count)) + "\n")
    model = MODELS[kind]
    scorers = {"in_process": lambda: in_process(repository, model, source),
               "ray_1": lambda: on_ray(repository, model, source, 1, work / f"{kind}-1.jsonl"),
               "ray_2": lambda: on_ray(repository, model, source, 2, work / f"{kind}-2.jsonl")}
    measured: dict[str, list[dict[str, Any]]] = {name: [] for name in scorers}
    for round_ in range(rounds):
        for name in list(scorers)[::1 if round_ % 2 == 0 else -1]:
            measured[name].append(scorers[name]())
    reference = measured["in_process"][0]["lines"]
    runs = {name: summary(results, reference) for name, results in measured.items()}
    one, two, local = (runs[name]["steady_rate"] for name in ("ray_1", "ray_2", "in_process"))
    return {"model": model, "version": reference[0]["model_version"], "n_samples": reference[0]["n_samples"],
            "runs": runs, "ray_2_over_ray_1": round(two / one, 2), "ray_1_over_in_process": round(one / local, 2),
            "ray_overhead_at_1_actor": round(1 - one / local, 3),
            "per_round": [{"ray_2_over_ray_1": round(b["steady_rate"] / a["steady_rate"], 2),
                           "ray_1_over_in_process": round(a["steady_rate"] / c["steady_rate"], 2)}
                          for a, b, c in zip(*(measured[name] for name in ("ray_1", "ray_2", "in_process")),
                                             strict=True)],
            "projection": {str(n): round(n * two / 2, 1) for n in PROJECTED_WORKERS}}


def summary(results: list[dict[str, Any]], reference: list[dict[str, Any]]) -> dict[str, Any]:
    """The rounds' means, each round's steady rate, and whether every round wrote the reference's lines."""
    mean = {name: round(sum(r[name] for r in results) / len(results), 2)
            for name in ("seconds", "all_running_s", "total_rate", "steady_rate")}
    return {"inputs": results[0]["inputs"], **mean, "steady_rates": [r["steady_rate"] for r in results],
            "same_lines_as_in_process": all(r["lines"] == reference for r in results)}


def resume_check(repository: Path, count: int, work: Path) -> dict[str, Any]:
    """``count`` images on Ray in a child process, interrupted once half are written, then resumed."""
    source, out = work / "resume.jsonl", work / "resume-scores.jsonl"
    source.write_text("\n".join(image_lines(count)) + "\n")
    command = [sys.executable, "-m", "service.batch_scoring", "--engine", "ray", "--actors", "2", "--model",
               MODELS["images"], "--model-repository", str(repository), "--input", str(source), "--output", str(out),
               "--chunk", "256"]
    partial = out.with_name(out.name + ".partial")
    started = time.perf_counter()
    child = subprocess.Popen(command, cwd=ROOT, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 1800
    while child.poll() is None and time.monotonic() < deadline:
        if partial.is_file() and count_lines(partial) >= count // 2:
            break
        time.sleep(0.2)
    finished_first = child.poll() is not None
    child.send_signal(signal.SIGINT)  # as Ctrl-C stops a run: the driver stops its Ray and exits
    child.wait(timeout=300)
    with contextlib.suppress(ProcessLookupError):  # anything the stopped run left in its group
        os.killpg(child.pid, signal.SIGKILL)
    stopped_at = count_lines(partial) if partial.is_file() else None
    resumed = subprocess.run(command, cwd=ROOT, stderr=subprocess.DEVNULL, timeout=3600, check=False)
    keys = [json.loads(line)["key"] for line in out.read_text().splitlines()] if out.is_file() else []
    return {"lines": count, "stopped_at": stopped_at, "finished_before_the_stop": finished_first,
            "resumed_exit": resumed.returncode,
            "keys_once": len(keys) == len(set(keys)) == count and set(keys) == {f"i{i}" for i in range(count)},
            "seconds": round(time.perf_counter() - started, 1)}


def count_lines(path: Path) -> int:
    with path.open("rb") as handle:
        return sum(1 for line in handle if line.endswith(b"\n"))


def markdown(results: dict[str, Any]) -> str:
    rows = []
    for kind, entry in results["modalities"].items():
        for name, run in entry["runs"].items():
            rounds = ", ".join(f"{rate:g}" for rate in run["steady_rates"])
            rows.append(f"| {kind} ({entry['model']} {entry['version']}) | {name.replace('_', ' ')} | {run['inputs']} "
                        f"| {run['all_running_s']:.1f} | {run['total_rate']:.0f} | {run['steady_rate']:.0f} ({rounds}) "
                        f"| {run['same_lines_as_in_process']} |")
    lines = [
        "# Offline scoring: in process against Ray Data", "",
        "```bash", results["command"], "```", "",
        f"{results['cpu_count']} CPU cores, one torch thread per scorer, chunks of {CHUNK} inputs, each model at its "
        f"default sample count; a local Ray of {results['ray_cpus']} CPUs (started in {results['ray_start_s']} s, "
        f"apart from the runs); {results['date']}; each scorer {results['rounds']} times, the order reversed every "
        "other round, the means shown (each round's steady rate in brackets). Inputs per second: total from the "
        "scorer's construction (Ray: "
        "the pipeline's start, actor starts and model loads included) to the last chunk scored; steady: the "
        "chunks scored once every scorer had scored its first, over the time they took.", "",
        "| inputs | scorer | count | all scorers running after (s) | total /s | steady /s | lines as in process "
        "(every round) |",
        "| --- | --- | --- | --- | --- | --- | --- |", *rows, ""]
    for kind, entry in results["modalities"].items():
        per_round = "; ".join(f"{r['ray_2_over_ray_1']}x and {r['ray_1_over_in_process']}x" for r in entry["per_round"])
        lines += [f"**{kind}**: Ray at 2 actors {entry['ray_2_over_ray_1']}x its 1-actor rate (target >= 1.5x); "
                  f"at 1 actor {entry['ray_1_over_in_process']}x the in-process rate (target >= 0.9x; the overhead "
                  f"Ray adds at one actor: {entry['ray_overhead_at_1_actor']:.1%}); round by round {per_round}. "
                  "Projection, not a measurement: "
                  "N workers of one core each at this machine's 2-actor rate per actor give "
                  + ", ".join(f"{rate:,.0f}/s at N = {n}" for n, rate in entry["projection"].items())
                  + " (if reading, the driver's writing and the network keep up).", ""]
    resume = results.get("resume")
    if resume:
        lines += ["```bash", resume["command"], "```", "",
                  f"**Resume**: {resume['lines']:,} image lines on Ray (2 actors) interrupted (SIGINT) with "
                  f"{resume['stopped_at']} lines written, then resumed (exit {resume['resumed_exit']}): every key "
                  f"exactly once: {resume['keys_once']} ({resume['seconds']} s in all).", ""]
    return "\n".join(lines)


def all_rates(args: argparse.Namespace) -> dict[str, Any]:
    """The rates of every scorer, texts and images, on a local Ray started once (its start timed apart)."""
    started = time.perf_counter()
    start_local_ray(num_cpus=os.cpu_count())
    import ray

    results: dict[str, Any] = {"ray_cpus": os.cpu_count(), "ray_start_s": round(time.perf_counter() - started, 1),
                               "ray": ray.__version__, "rounds": args.rounds, "modalities": {}}
    try:
        with tempfile.TemporaryDirectory(prefix="director-offline-") as tmp:
            for kind, count in (("texts", args.texts), ("images", args.images)):
                results["modalities"][kind] = modality(args.repository, kind, count, args.rounds, Path(tmp))
    finally:
        ray.shutdown()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=2000)
    parser.add_argument("--images", type=int, default=12000)
    parser.add_argument("--rounds", type=int, default=2, help="runs of every scorer (the order reversed every other)")
    parser.add_argument("--resume-lines", type=int, default=0,
                        help="only the stop-and-resume check on N images, added to the results already in --out")
    parser.add_argument("--repository", type=Path, default=ROOT / "model_repository")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks-offline-scoring.json")
    parser.add_argument("--markdown", type=Path, default=ROOT / "docs" / "benchmarks-offline-scoring.md")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    command = " ".join(["python -m benchmarks.offline_scoring", *(argv if argv is not None else sys.argv[1:])])
    if args.resume_lines:
        payload = json.loads(args.out.read_text())
        with tempfile.TemporaryDirectory(prefix="director-offline-") as tmp:
            payload["resume"] = {"command": command, **resume_check(args.repository, args.resume_lines, Path(tmp))}
    else:
        payload = {"command": command, "cpu_count": os.cpu_count(), "torch_threads": 1,
                   "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__, **all_rates(args)}
    args.out.write_text(json.dumps(payload, indent=2) + "\n")
    args.markdown.write_text(markdown(payload))
    print(json.dumps(payload, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
