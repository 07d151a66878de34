"""Where an image DIRECTOR version's forward spends its time, part by part, against a deterministic version's whole
forward: the scripted modules' own parts (the embedding, the real prefix, the rollout's sampled step, the backbone's
own last transitions, the readout and its features, the feature scorer) timed alone on the same inputs, beside
``sample_rows`` and ``scored_rows`` whole, in rounds that alternate every timing, one torch thread.

    .venv/bin/python -m benchmarks.forward_parts --director model_repository/fashion-vit/7 \\
        --deterministic model_repository/fashion-vit-deterministic/2 --out docs/benchmarks-forward-parts.json \\
        --markdown docs/benchmarks-forward-parts.md

It answers "how close is ``scored_rows`` to its floor": the deterministic forward plus the kernel step and a second
readout (the parts ``scored_rows`` cannot do without while the served score reads the backbone's own features).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import Any

import torch

from artifact.contract import ImageInput, parse_manifest, read_document
from benchmarks.report import spread, store_entry
from benchmarks.timing import scripted_module, seconds_per_call

PAGE_TITLE = "# Where a forward's time goes (CPU, this machine)"


def timings(director: torch.jit.ScriptModule, deterministic: torch.jit.ScriptModule, shape: tuple[int, int, int],
            batch: int, seed: int) -> dict[str, Callable[[], object]]:
    """What is timed at ``batch`` images of ``shape`` (C, H, W): the whole forwards, then each part on the input it
    reads in ``scored_rows`` (at S = 1)."""
    pixels = torch.rand(batch, *shape, generator=torch.Generator().manual_seed(seed))  # [B, C, H, W]
    repeats = torch.ones(batch, dtype=torch.long)  # [B]
    teacher = list(director.rollout.teacher.children())
    with torch.no_grad():
        embedded = director.embedding(pixels)  # [B, N, D]
        start = director.prefix(embedded, None)  # [B, N, D] X_{T-K}
        end = start
        for transition in teacher:
            end = transition(end, None)  # [B, N, D] the backbone's own X_T
        features = director.readout.features(end, None)  # [B, D']

    def run_teacher() -> torch.Tensor:
        x = start
        for transition in teacher:
            x = transition(x, None)
        return x

    return {
        "deterministic sample_rows": lambda: deterministic.sample_rows(pixels, repeats),
        "DIRECTOR sample_rows": lambda: director.sample_rows(pixels, repeats),
        "DIRECTOR scored_rows": lambda: director.scored_rows(pixels, repeats),
        "embedding": lambda: director.embedding(pixels),
        "prefix (real layers)": lambda: director.prefix(embedded, None),
        "rollout (kernel step, noise)": lambda: director.rollout(start, repeats, None),
        "teacher (real last layers)": run_teacher,
        "readout": lambda: director.readout(end),
        "readout features": lambda: director.readout.features(end, None),
        "feature scorer": lambda: director.feature_scorer(features),
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    director, deterministic = scripted_module(args.director, "cpu"), scripted_module(args.deterministic, "cpu")
    results: dict[str, Any] = {"director": str(args.director), "deterministic": str(args.deterministic),
                               "threads": args.threads, "rounds": args.rounds, "torch": torch.__version__,
                               "date": date.today().isoformat(), "batches": {}}
    spec = parse_manifest(read_document(args.director)).input
    assert isinstance(spec, ImageInput), f"{args.director} is not an image model"
    for batch in args.batches:
        calls = timings(director, deterministic, (spec.channels, spec.height, spec.width), batch, args.seed)
        samples: dict[str, list[float]] = {name: [] for name in calls}
        with torch.no_grad():
            for round_index in range(args.rounds):
                order = list(calls) if round_index % 2 == 0 else list(calls)[::-1]
                for name in order:
                    samples[name].append(seconds_per_call(calls[name], 5, args.seconds) * 1e3)
        results["batches"][str(batch)] = {name: spread(values) for name, values in samples.items()}
    return results


def floor_ms(parts: dict[str, dict[str, float]]) -> float:
    """What ``scored_rows`` cannot do without: the deterministic forward, the kernel step and a second readout."""
    return (parts["deterministic sample_rows"]["median"] + parts["rollout (kernel step, noise)"]["median"]
            + parts["readout"]["median"])


def markdown(results: dict[str, Any]) -> list[str]:
    """One comparison's section of the page."""
    lines = [f"## {results['director']} against {results['deterministic']}", "", "```bash", results["command"],
             "```", "",
             f"`{results['director']}` against `{results['deterministic']}`, S = 1, {results['threads']} torch "
             f"thread(s), torch {results['torch']}, {results['rounds']} rounds on {results['date']} (every timing "
             "once per round, the order reversed every other round), milliseconds per call, median [min, max].", ""]
    for batch, parts in results["batches"].items():
        plain = parts["deterministic sample_rows"]["median"]
        scored = parts["DIRECTOR scored_rows"]["median"]
        lines += [f"### {batch} image(s) per forward", "", "| what | ms per call | vs the deterministic forward |",
                  "| --- | --- | --- |"]
        lines += [f"| {name} | {p['median']:.3f} [{p['min']:.3f}, {p['max']:.3f}] | {p['median'] / plain:.2f}x |"
                  for name, p in parts.items()]
        lines += ["", f"`scored_rows` {scored:.3f} ms against its floor (the deterministic forward + the kernel step "
                  f"+ a second readout) {floor_ms(parts):.3f} ms; its rate {plain / scored:.2f}x the deterministic "
                  "model's.", ""]
    return lines[:-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--director", type=Path, required=True, help="an image DIRECTOR version folder")
    parser.add_argument("--deterministic", type=Path, required=True, help="a deterministic version of its backbone")
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 32])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=0.5, help="seconds per timing (at least 5 calls)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="JSON file; this comparison's entry is replaced, others kept")
    parser.add_argument("--markdown", type=Path, help="Markdown page of every entry of --out (hand analysis kept)")
    args = parser.parse_args()
    results = {**measure(args), "command": " ".join(["python -m benchmarks.forward_parts", *sys.argv[1:]])}
    print("\n".join(markdown(results)))
    if args.out is not None:
        store_entry(args.out, args.markdown, f"{args.director} against {args.deterministic}", results, PAGE_TITLE,
                    markdown)


if __name__ == "__main__":
    main()
