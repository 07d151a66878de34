"""What two or more versions of one model cost per request on the server's own inference path, A/B'd round by round:
the batch the worker forms (the decoder's decode, one forward through ``scored_rows`` or ``sample_rows``, the OOD
score's per-input scores, the served temperature, per input when the version makes it follow a score, and the
summaries), in this process, without HTTP. It answers "what does the chosen OOD score cost against an older version's"
at the same sample count, on the same inputs.

    .venv/bin/python -m benchmarks.version_cost --model movie-reviews-minilm --versions 3 5 --rounds 5 \\
        --out docs/benchmarks-version-cost.json --markdown docs/benchmarks-version-cost.md

A version of another model with the same inputs can be named as ``MODEL/VERSION``: the deterministic backbone served
beside DIRECTOR (``--versions fashion-vit-deterministic/1 6``) gives what DIRECTOR's own steps cost over the plain
model's, the ratio the budget search measures through HTTP with far more noise.

Inputs: image models get seeded random pixels; text models get sentences of the movie-review test split (the
corpus the text models were trained on; ``training.data.texts``). Each round times every version (their order
alternating between rounds) at each batch size: at least 5 calls and ``--seconds`` each, torch pinned to
``--threads``. Ratios are paired by round (this machine's speed drifts by tens of percent over minutes).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import warnings
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.report import spread, store_entry
from benchmarks.timing import seconds_per_call
from models.uncertainty import temperature_for
from service.engine.artifact import Artifact, load_artifact
from service.engine.device import Device
from service.engine.inference import summarize_requests
from service.engine.modalities.base import InputLimits, PixelValues, RawInput, Text

PAGE_TITLE = "# What a version's served inference costs (CPU, this machine)"
LIMITS = InputLimits(max_text_chars=100_000, max_image_pixels=10**8, max_request_pixels=10**9)


def raw_inputs(artifact: Artifact, count: int, seed: int) -> list[RawInput]:
    """``count`` request inputs for the artifact's modality, as a JSON request's parse gives them: seeded pixel lists,
    or held-out movie-review sentences."""
    manifest = artifact.manifest
    if manifest.modality == "text":
        from training.data.texts import load_movie_reviews

        texts = load_movie_reviews(val_size=1000, split_seed=0).test.texts
        return [Text(texts[i % len(texts)], ["body", "inputs", i]) for i in range(count)]
    spec = manifest.input
    rng = np.random.default_rng(seed)
    shape = (spec.channels, spec.height, spec.width)  # type: ignore[union-attr]
    return [PixelValues(rng.random(shape).round(4).tolist(), ["body", "inputs", i]) for i in range(count)]


def version_folder(repository: Path, model: str, version: str) -> Path:
    """``version`` of ``model``, or ``other-model/version`` (a baseline served beside it, such as the deterministic
    backbone: its inputs are the same kind)."""
    return repository / (version if "/" in version else f"{model}/{version}")


def infer(artifact: Artifact, device: Device, items: list[RawInput], n_samples: int) -> None:
    """One batch through the worker's steps: decode, forward, scores, temperature, summaries."""
    batch = artifact.decoder.decode(items, LIMITS, artifact.manifest.name)
    runner = artifact.runner
    cost = runner.batch_cost(max(128, len(items) * n_samples), 1 << 20)
    forward = runner.forward(artifact.rows, device, batch, [n_samples] * len(items), cost, None)
    temperature = temperature_for(artifact.temperature, artifact.named_scores(forward.scores))
    summarize_requests(forward.rows, [len(items)], [n_samples], temperature)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    device = Device(torch.device("cpu"))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning)
        artifacts = {v: load_artifact(version_folder(Path(args.repository), args.model, v), device)
                     for v in args.versions}
    inputs = {b: raw_inputs(next(iter(artifacts.values())), b, args.seed) for b in args.batches}
    rounds = []
    for r in range(args.rounds):
        order = args.versions if r % 2 == 0 else args.versions[::-1]
        timed: dict[str, dict[str, float]] = {}
        for version in order:
            artifact = artifacts[version]
            timed[version] = {str(b): 1000 * seconds_per_call(
                lambda a=artifact, b=b: infer(a, device, inputs[b], args.n_samples), 5, args.seconds)
                for b in args.batches}
        rounds.append(timed)
        print(f"round {r + 1}/{args.rounds}: " + ", ".join(f"v{v} {json.dumps(t)}" for v, t in timed.items()),
              file=sys.stderr)
    described = {v: {"ood_score": a.manifest.ood.score, "scored_rows": a.scored,
                     "temperature_by_score": a.manifest.temperature_by_score is not None}
                 for v, a in artifacts.items()}
    return {"model": args.model, "versions": described, "batches": args.batches, "n_samples": args.n_samples,
            "rounds": rounds, "threads": args.threads, "seconds": args.seconds, "torch": torch.__version__,
            "date": date.today().isoformat(), "command": " ".join(["python -m benchmarks.version_cost", *sys.argv[1:]])}


def summarise(results: dict[str, Any]) -> dict[str, Any]:
    """Per version and batch size: the median and range of ms per batch over the rounds, and of its ratio to the first
    version's time in the same round."""
    first = next(iter(results["versions"]))
    out: dict[str, Any] = {}
    for version in results["versions"]:
        out[version] = {}
        for batch in map(str, results["batches"]):
            ms = [r[version][batch] for r in results["rounds"]]
            ratios = [r[version][batch] / r[first][batch] for r in results["rounds"]]
            out[version][batch] = {"ms_per_batch": spread(ms), "vs_first": spread(ratios),
                                   "ms_per_input": round(statistics.median(ms) / int(batch), 3)}
    results["summary"] = out
    return out


def shown(version: str) -> str:
    return version if "/" in version else f"v{version}"


def entry_key(model: str, versions: list[str]) -> str:
    """The JSON entry of a run: the model's name, or with its baseline when that is another model's version."""
    return model if "/" not in versions[0] else f"{model} against {versions[0]}"


def markdown(results: dict[str, Any]) -> list[str]:
    first = next(iter(results["versions"]))
    lines = [f"## {entry_key(results['model'], list(results['versions']))}", "", "```bash",
             results["command"], "```", "",
             f"{results['model']}, S = {results['n_samples']}, {results['threads']} torch thread(s), torch "
             f"{results['torch']}, {len(results['rounds'])} rounds on {results['date']}. The worker's steps for one "
             f"batch (decode, forward, per-input scores, temperature, summaries), without HTTP. `vs {shown(first)}`: "
             f"the time over {shown(first)}'s in the same round (median [min, max]).", "",
             "| version | OOD score | per-input temperature | inputs per batch | ms per batch | ms per input | "
             f"vs {shown(first)} |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for version, about in results["versions"].items():
        for batch, row in results["summary"][version].items():
            ms, ratio = row["ms_per_batch"], row["vs_first"]
            lines.append(f"| {version} | {about['ood_score']}{' (scored_rows)' if about['scored_rows'] else ''} | "
                         f"{'yes' if about['temperature_by_score'] else 'no'} | {batch} | {ms['median']:.2f} "
                         f"[{ms['min']:.2f}, {ms['max']:.2f}] | {row['ms_per_input']:.3f} | {ratio['median']:.2f}x "
                         f"[{ratio['min']:.2f}, {ratio['max']:.2f}] |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repository", default="model_repository")
    parser.add_argument("--model", required=True)
    parser.add_argument("--versions", nargs="+", required=True,
                        help="versions of --model, or MODEL/VERSION of another model with the same inputs; the first "
                             "is the baseline of the ratios")
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 32])
    parser.add_argument("--n-samples", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=2.0, help="seconds per timing (at least 5 calls)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="JSON file; this model's entry is replaced, others kept")
    parser.add_argument("--markdown", type=Path, help="Markdown page: this model's section, hand analysis kept")
    args = parser.parse_args()
    results = measure(args)
    summarise(results)
    print("\n".join(markdown(results)))
    if args.out is not None:
        store_entry(args.out, args.markdown, entry_key(args.model, args.versions), results, PAGE_TITLE, markdown)


if __name__ == "__main__":
    main()
