"""How big a forward the text artifact wants: raw ``sample_rows`` time against padded tokens x samples.

The server packs text requests up to ``max_batch_tokens`` (padded tokens x sampled rows, service/engine/batch_cost.py).
This times the exported text artifact alone, with the server's thread pinning, at several widths, sample counts
and batch sizes, so the default can be read off a measurement (inputs per second flat, then falling once the
forward no longer fits the cache) rather than guessed.

    .venv/bin/python benchmarks/text_batch_tokens.py --threads 1 --out docs/benchmarks-text.json \
        --markdown docs/benchmarks-text.md
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
from report import write_keeping_analysis
from server import ROOT
from timing import seconds_per_call
from tqdm import tqdm

CLS, SEP, FIRST_WORD, VOCAB_END = 101, 102, 1000, 20000  # BERT uncased ids: [CLS], [SEP], ordinary word pieces


def time_forward(module: torch.jit.ScriptModule, inputs: int, width: int, n_samples: int, min_seconds: float,
                 seed: int = 0) -> float:
    """Seconds per ``sample_rows`` forward of ``inputs`` texts of ``width`` tokens, ``n_samples`` rows each."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(FIRST_WORD, VOCAB_END, (inputs, width), generator=generator)  # [B, L]
    ids[:, 0], ids[:, -1] = CLS, SEP
    mask = torch.ones(inputs, width, dtype=torch.long)  # [B, L]
    repeats = torch.full((inputs,), n_samples, dtype=torch.long)  # [B]
    with torch.inference_mode():
        return seconds_per_call(lambda: module.sample_rows(ids, mask, repeats), 3, min_seconds)


def measure(folder: Path, widths: list[int], samples: list[int], max_tokens: int, threads: int,
            min_seconds: float) -> list[dict[str, Any]]:
    torch.set_num_threads(threads)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning)
        module = torch.jit.load(str(folder / "director.ts"))
    plan = []
    for width in widths:
        for n_samples in samples:
            inputs = 1
            while inputs * width * n_samples <= max_tokens:
                plan.append((width, n_samples, inputs))
                inputs *= 2
    rows = []
    for width, n_samples, inputs in tqdm(plan, desc="text artifact forwards"):
        seconds = time_forward(module, inputs, width, n_samples, min_seconds)
        rows.append({"width": width, "n_samples": n_samples, "inputs": inputs,
                     "tokens_x_samples": inputs * width * n_samples, "ms_per_forward": round(seconds * 1000, 2),
                     "inputs_per_s": round(inputs / seconds, 2)})
    return rows


def write_markdown(results: dict[str, Any], path: Path) -> None:
    lines = ["# Text artifact: forward size (CPU, this machine)", "", "```bash", results["command"], "```", "",
             f"Model `{results['model']}`, raw `sample_rows` of the TorchScript artifact (no server), torch "
             f"{results['torch']}, {results['threads']} thread(s). Random word-piece ids between [CLS] and [SEP], "
             "no padding inside a width. `tokens x samples` is what the server's `max_batch_tokens` bounds.", "",
             "| width (tokens) | S | inputs | tokens x samples | ms per forward | inputs/s | vs 1 input |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    single = {(r["width"], r["n_samples"]): r["inputs_per_s"] for r in results["rows"] if r["inputs"] == 1}
    for r in results["rows"]:
        ratio = r["inputs_per_s"] / single[(r["width"], r["n_samples"])]
        lines.append(f"| {r['width']} | {r['n_samples']} | {r['inputs']} | {r['tokens_x_samples']} | "
                     f"{r['ms_per_forward']} | {r['inputs_per_s']} | {ratio:.2f}x |")
    write_keeping_analysis(path, lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--folder", type=Path, default=ROOT / "model_repository" / "movie-reviews-minilm" / "1")
    parser.add_argument("--widths", type=int, nargs="+", default=[32, 64], help="padded lengths in tokens")
    parser.add_argument("--samples", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--max-tokens", type=int, default=16384, help="largest tokens x samples to time")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--min-seconds", type=float, default=1.0, help="time per configuration (at least 3 forwards)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--markdown", type=Path, default=None, help="rewrite this file's table (analysis kept)")
    args = parser.parse_args(argv)
    manifest = json.loads((args.folder / "manifest.json").read_text())
    if manifest.get("modality") != "text":
        parser.error(f"{args.folder} is not a text model")
    results: dict[str, Any] = {
        "command": " ".join([".venv/bin/python", "benchmarks/text_batch_tokens.py", *(argv or sys.argv[1:])]),
        "model": f"{manifest['name']}/{manifest['version']}", "torch": torch.__version__, "threads": args.threads,
        "rows": measure(args.folder, args.widths, args.samples, args.max_tokens, args.threads, args.min_seconds),
    }
    for row in results["rows"]:
        print(json.dumps(row))
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    if args.markdown is not None:
        write_markdown(results, args.markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
