"""Peak memory and time of ``python -m training calibrate`` at two data-set sizes, on a random-weight Qwen2 of about
100M parameters built from a config (no hub), so that one can see what grows with the data and what the settings
bound. Each size is one calibrate run in a child process; its peak resident memory is the kernel's ``VmHWM``.

    python -m benchmarks.calibrate_scale --sizes 400 1600 --out docs/benchmarks-calibrate.json

Writes the JSON and ``docs/benchmarks-calibrate.md``'s table.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

WORDS = (
    "alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "lambda", "mu", "nu",
    "xi", "omicron", "pi", "rho", "sigma", "tau", "upsilon", "phi", "chi", "psi", "omega", "red", "green", "blue",
    "cyan", "magenta", "yellow", "black", "white",
)
QWEN2_100M = dict(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                  num_attention_heads=12, num_key_value_heads=4, max_position_embeddings=512)


def save_checkpoint(folder: Path) -> int:
    """A random Qwen2 classifier of ~100M parameters with a WordPiece tokenizer; returns its parameter count."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForSequenceClassification

    torch.manual_seed(0)
    model = Qwen2ForSequenceClassification(Qwen2Config(**QWEN2_100M, num_labels=2, pad_token_id=0))
    model.save_pretrained(folder)
    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.train_from_iterator([" ".join(WORDS)] * 10, trainers.WordPieceTrainer(
        vocab_size=200, special_tokens=["[PAD]", "[UNK]"], show_progress=False))
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="[PAD]", unk_token="[UNK]").save_pretrained(folder)
    return sum(p.numel() for p in model.parameters())


def write_texts(path: Path, rows: int, words: int, seed: int) -> None:
    rng = random.Random(seed)
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["text", "label"])
        for i in range(rows):
            writer.writerow([" ".join(rng.choices(WORDS, k=words)), str(i % 2)])


def peak_rss_run(command: list[str], log: Path) -> tuple[int, float, int]:
    """(exit status, seconds, peak resident bytes) of ``command``, its output to ``log``."""
    start = time.perf_counter()
    peak = 0
    with log.open("w") as out:
        child = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        status = Path(f"/proc/{child.pid}/status")
        while child.poll() is None:
            try:
                for line in status.read_text().splitlines():
                    if line.startswith("VmHWM:"):
                        peak = max(peak, int(line.split()[1]) * 1024)
            except (FileNotFoundError, ProcessLookupError):
                break
            time.sleep(0.2)
    return child.wait(), time.perf_counter() - start, peak


def run_size(root: Path, checkpoint: Path, size: int, args: argparse.Namespace) -> dict[str, Any]:
    data = root / f"texts-{size}.csv"
    write_texts(data, int(size / 0.8), args.tokens, size)  # 80% train after the carved val and test
    run_dir = root / f"run-{size}"
    command = [sys.executable, "-m", "training", "calibrate", "--backbone", str(checkpoint), "--data", str(data),
               "--name", f"scale-{size}", "--run-dir", str(run_dir), "--repository", str(root / "repo"),
               "--set", f"threads={args.threads}", "--set", f"text.max_length={args.tokens + 2}",
               "--set", "distil.epochs=1", "--set", "distil.depth_candidates=[1]",
               "--set", f"distil.start_states_memory_bytes={args.memory_budget}", "--set", "distil.val_images=100",
               "--set", "distil.tau_images=100", "--set", "export.threshold_images=100",
               "--set", "export.ood_validation_images=50", "--set", "evaluate.ood_images=50",
               "--set", "export.sample_counts=[1,2]", "--set", "export.default_samples=1",
               "--set", f"export.docs_dir={root / 'docs'}"]
    status, seconds, peak = peak_rss_run(command, root / f"calibrate-{size}.log")
    if status != 0:
        raise SystemExit(f"calibrate at {size} inputs failed: see {root / f'calibrate-{size}.log'}")
    payload = torch.load(run_dir / "depth-1" / "director.pt", map_location="cpu", weights_only=False)
    states = run_dir / "depth-1" / "rank-0" / "start_states.f16"
    return {"train_inputs": size, "seconds": round(seconds, 1), "peak_rss_bytes": peak,
            "distil_seconds": round(float(payload["seconds"]), 1),  # one epoch and the teacher's one-time pass
            "start_states_on_disk_bytes": states.stat().st_size if states.exists() else 0}


def markdown(results: dict[str, Any]) -> str:
    lines = ["# Calibrating at scale: memory and time", "", "Written by `python -m benchmarks.calibrate_scale` "
             "(command below); a random-weight Qwen2 built from a config, since no large checkpoint can be "
             "downloaded here.", "", "```bash", results["command"], "```", "",
             f"Backbone: Qwen2 classifier, {results['parameters'] / 1e6:.0f}M parameters "
             f"({results['shape']['num_hidden_layers']} layers, width {results['shape']['hidden_size']}, "
             f"{results['shape']['num_key_value_heads']} key-value heads), texts of {results['tokens'] + 2} tokens "
             f"(text.max_length), depth K = 1, one distillation epoch, {results['threads']} torch threads on "
             f"{results['cpu_count']} cores. Start states past {results['memory_budget'] / 2**20:.0f} MiB "
             "(distil.start_states_memory_bytes) go to disk in float16.", "",
             "| training inputs | calibrate (s) | distil stage (s): one epoch and the teacher pass | peak RSS | "
             "start states on disk |",
             "| --- | --- | --- | --- | --- |"]
    for row in results["runs"]:
        lines.append(f"| {row['train_inputs']} | {row['seconds']} | {row['distil_seconds']} | "
                     f"{row['peak_rss_bytes'] / 2**30:.2f} GiB | {row['start_states_on_disk_bytes'] / 2**20:.0f} MiB |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs=2, default=[400, 1600])
    parser.add_argument("--tokens", type=int, default=30, help="words per text")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--memory-budget", type=int, default=64 * 2**20, help="distil.start_states_memory_bytes")
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks-calibrate.json"))
    parser.add_argument("--work-dir", type=Path, default=Path("runs/calibrate-scale"),
                        help="the checkpoint, data, runs and logs (kept, to read after a failure)")
    args = parser.parse_args()
    root = args.work_dir
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    parameters = save_checkpoint(root / "qwen2")
    runs = [run_size(root, root / "qwen2", size, args) for size in args.sizes]
    results = {"command": "python -m benchmarks.calibrate_scale " + " ".join(sys.argv[1:]), "parameters": parameters,
               "shape": QWEN2_100M, "tokens": args.tokens, "threads": args.threads, "cpu_count": os.cpu_count(),
               "memory_budget": args.memory_budget, "torch": torch.__version__, "runs": runs}
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(markdown(results))
    print(markdown(results))


if __name__ == "__main__":
    main()
