"""Peak memory and time of ``python -m training calibrate`` at two data-set sizes, on random-weight backbones built
from a config (no hub): a Qwen2 of about 100M parameters on a CSV of texts, and timm's ViT-B/16 (86M, 224 x 224,
197 tokens) on an image folder, so that one can see what grows with the data and what the settings bound. Each size
is one calibrate run in a child process; its peak resident memory is the kernel's ``VmHWM``.

    python -m benchmarks.calibrate_scale --backbone qwen2-100m --sizes 300 1200 --threads 1
    python -m benchmarks.calibrate_scale --backbone vit-b16 --sizes 100 400 --threads 2

Each writes its part of ``docs/benchmarks-calibrate.json`` and the table of ``docs/benchmarks-calibrate.md``.
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
VIT_B16 = "vit_base_patch16_224"
IMAGE_CLASSES = ["a", "b", "c"]
QWEN2_100M = dict(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                  num_attention_heads=12, num_key_value_heads=4, max_position_embeddings=512)


def save_vit(folder: Path) -> int:
    """timm's ViT-B/16 with random weights and a 3-class head, as a weights file; returns its parameter count."""
    import timm

    torch.manual_seed(0)
    model = timm.create_model(VIT_B16, pretrained=False, num_classes=len(IMAGE_CLASSES))
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), folder / "vit.pth")
    return sum(p.numel() for p in model.parameters())


def write_images(root: Path, count: int, seed: int) -> None:
    """``count`` small noise PNGs in class folders (calibrate resizes them to 224 x 224, as the server would)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    for i in range(count):
        folder = root / IMAGE_CLASSES[i % len(IMAGE_CLASSES)]
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8), "RGB").save(folder / f"{i}.png")


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
    run_dir = root / f"run-{size}"
    if args.backbone == "vit-b16":
        data = root / f"images-{size}"
        write_images(data, int(size / 0.8), size)  # 80% train after the carved val and test
        source = ["--backbone", f"timm:{VIT_B16}", "--checkpoint", str(checkpoint / "vit.pth"),
                  "--set", f"data.labels=[{','.join(IMAGE_CLASSES)}]"]
    else:
        data = root / f"texts-{size}.csv"
        write_texts(data, int(size / 0.8), args.tokens, size)
        source = ["--backbone", str(checkpoint), "--set", f"text.max_length={args.tokens + 2}"]
    command = [sys.executable, "-m", "training", "calibrate", *source, "--data", str(data),
               "--name", f"scale-{size}", "--run-dir", str(run_dir), "--repository", str(root / "repo"),
               "--set", f"threads={args.threads}",
               "--set", "distil.epochs=1", "--set", "distil.depth_candidates=[1]",
               "--set", f"distil.start_states_memory_bytes={args.memory_budget}", "--set", "distil.val_images=100",
               "--set", "distil.tau_images=100", "--set", "export.threshold_images=100",
               "--set", "export.ood_validation_images=50", "--set", "evaluate.ood_images=50",
               "--set", "export.sample_counts=[1,2]", "--set", "export.default_samples=1",
               "--set", f"export.docs_dir={root / 'docs'}"]
    status, seconds, peak = peak_rss_run(command, root / f"calibrate-{size}.log")
    if status != 0:
        raise SystemExit(f"calibrate at {size} inputs failed: see {root / f'calibrate-{size}.log'}")
    payload = torch.load(run_dir / "depth-1" / "director.pt", map_location="cpu", weights_only=True)
    states = run_dir / "depth-1" / "rank-0" / "start_states.f16"
    images = sum(p.stat().st_size for p in (run_dir / "images").glob("*.u8"))
    return {"train_inputs": size, "seconds": round(seconds, 1), "peak_rss_bytes": peak,
            "distil_seconds": round(float(payload["seconds"]), 1),  # one epoch and the teacher's one-time pass
            "start_states_on_disk_bytes": states.stat().st_size if states.exists() else 0,
            "images_on_disk_bytes": images}


ANALYSIS = "<!-- analysis: written by hand -->"


def describe(name: str, results: dict[str, Any]) -> str:
    """What was calibrated, in a sentence."""
    if name == "vit-b16":
        return (f"Backbone: timm {VIT_B16} with random weights, {results['parameters'] / 1e6:.0f}M parameters (12 "
                "layers, width 768, 197 tokens), an image folder of 32 x 32 PNGs converted to 224 x 224 (kept on disk "
                "in 8 bits, read per batch)")
    shape = results["shape"]
    return (f"Backbone: Qwen2 classifier, {results['parameters'] / 1e6:.0f}M parameters ({shape['num_hidden_layers']} "
            f"layers, width {shape['hidden_size']}, {shape['num_key_value_heads']} key-value heads), texts of "
            f"{results['tokens'] + 2} tokens (text.max_length)")


def markdown(everything: dict[str, dict[str, Any]], analysis: str) -> str:
    lines = ["# Calibrating at scale: memory and time", "", "Written by `python -m benchmarks.calibrate_scale` "
             "(commands below); random-weight backbones built from configs, since no large checkpoint can be "
             "downloaded here."]
    for name, results in everything.items():
        lines += ["", f"## {name}", "", "```bash", results["command"], "```", "",
                  f"{describe(name, results)}; depth K = 1, one distillation epoch, {results['threads']} torch "
                  f"threads on {results['cpu_count']} cores. Start states past {results['memory_budget'] / 2**20:.0f} "
                  "MiB (distil.start_states_memory_bytes) go to disk in float16.", "",
                  "| training inputs | calibrate (s) | distil stage (s): one epoch and the teacher pass | peak RSS | "
                  "start states on disk | images on disk |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for row in results["runs"]:
            lines.append(f"| {row['train_inputs']} | {row['seconds']} | {row['distil_seconds']} | "
                         f"{row['peak_rss_bytes'] / 2**30:.2f} GiB | "
                         f"{row['start_states_on_disk_bytes'] / 2**20:.0f} MiB | "
                         f"{row.get('images_on_disk_bytes', 0) / 2**20:.0f} MiB |")
    return "\n".join(lines) + "\n\n" + ANALYSIS + "\n" + analysis


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backbone", choices=["qwen2-100m", "vit-b16"], default="qwen2-100m")
    parser.add_argument("--sizes", type=int, nargs=2, default=[400, 1600])
    parser.add_argument("--tokens", type=int, default=30, help="words per text")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--memory-budget", type=int, default=64 * 2**20, help="distil.start_states_memory_bytes")
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks-calibrate.json"))
    parser.add_argument("--work-dir", type=Path, default=Path("runs/calibrate-scale"),
                        help="the checkpoint, data, runs and logs (kept, to read after a failure)")
    args = parser.parse_args()
    root = args.work_dir / args.backbone
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    if args.backbone == "vit-b16":
        parameters, shape = save_vit(root / "vit"), {"model": VIT_B16}
        runs = [run_size(root, root / "vit", size, args) for size in args.sizes]
    else:
        parameters, shape = save_checkpoint(root / "qwen2"), QWEN2_100M
        runs = [run_size(root, root / "qwen2", size, args) for size in args.sizes]
    results = {"command": "python -m benchmarks.calibrate_scale " + " ".join(sys.argv[1:]), "parameters": parameters,
               "shape": shape, "tokens": args.tokens, "threads": args.threads, "cpu_count": os.cpu_count(),
               "memory_budget": args.memory_budget, "torch": torch.__version__, "runs": runs}
    everything = json.loads(args.out.read_text()) if args.out.is_file() else {}
    everything[args.backbone] = results
    args.out.write_text(json.dumps(everything, indent=2) + "\n")
    page = args.out.with_suffix(".md")
    analysis = page.read_text().partition(ANALYSIS)[2].lstrip("\n") if page.is_file() else ""
    page.write_text(markdown(everything, analysis))
    print(markdown(everything, analysis))


if __name__ == "__main__":
    main()
