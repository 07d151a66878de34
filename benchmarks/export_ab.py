"""The torch.export artifact A/B'd against TorchScript on the same version: latency and throughput of the raw
forwards the server calls (``scored_rows`` where the OOD score reads per-input scores, and ``sample_rows``), both
formats loaded in one process, interleaved point by point and repeat by repeat (the order alternating), with the
server's thread pinning. Each ratio is AOTInductor's time over TorchScript's in the same repeat; the page reports
the median and range of those paired ratios. Image versions get random pixels, text versions ``--text-tokens`` random
word ids per input. It also measures how much Python another thread gets done while each format's forwards run
(``python_progress``): the server's event loop is such a thread.

The version folder must hold both files: ``python -m training.export.torch_export_version`` writes such a copy.

    .venv/bin/python benchmarks/export_ab.py --version /tmp/fv-aoti/fashion-vit/6 --threads 1 --repeats 11 \\
        --out docs/benchmarks-export.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from report import export_table
from timing import compiled_module, scripted_module, seconds_per_call
from tokenizers import Tokenizer

from artifact.contract import Manifest, TextInput, parse_manifest, read_document
from service.engine.artifact import uses_input_scores

# (inputs, samples per input): single-input latency, then batched throughput at the server's CPU batch sizes
POINTS = [(1, 1), (1, 16), (32, 1), (128, 1), (8, 16), (32, 4)]


Inputs = Callable[[int], tuple[torch.Tensor, ...]]  # batch size -> the model's inputs (repeats apart)


def inputs_of(folder: Path, manifest: Manifest, device: torch.device, text_tokens: int) -> Inputs:
    """What a forward takes for ``batch`` inputs: random pixels for an image model; for a text model ``text_tokens``
    random word ids (every one real: the mask all ones) from its tokenizer's vocabulary, past the special tokens."""
    if isinstance(manifest.input, TextInput):
        vocabulary = Tokenizer.from_file(str(folder / manifest.input.tokenizer)).get_vocab_size()
        length = min(text_tokens, manifest.input.max_length)

        def texts(batch: int) -> tuple[torch.Tensor, ...]:
            ids = torch.randint(1000, vocabulary, (batch, length), device=device)  # [B, L]
            return ids, torch.ones_like(ids)  # [B, L], [B, L]

        return texts
    shape = (manifest.input.channels, manifest.input.height, manifest.input.width)
    return lambda batch: (torch.rand(batch, *shape, device=device),)  # [B, C, H, W]


def load_both(folder: Path, device: torch.device, text_tokens: int = 32
              ) -> tuple[dict[str, Any], tuple[str, ...], Inputs]:
    """The two formats' modules on ``device``, the methods to time and the inputs they take."""
    manifest = parse_manifest(read_document(folder))
    scripted, compiled = scripted_module(folder, device), compiled_module(folder, manifest, device)
    methods = ("scored_rows", "sample_rows") if uses_input_scores(manifest) else ("sample_rows",)
    return {"torchscript": scripted, "aoti": compiled}, methods, inputs_of(folder, manifest, device, text_tokens)


def agreement(modules: dict[str, Any], method: str, inputs: Inputs, device: torch.device) -> float:
    """The largest logit difference of the two formats under one seed (the same draws: the package's numbers are
    ATen's)."""
    batch, repeats = inputs(16), torch.full((16,), 4, dtype=torch.long, device=device)
    outputs = []
    with torch.inference_mode():
        for module in modules.values():
            torch.manual_seed(0)
            out = getattr(module, method)(*batch, repeats)
            outputs.append(out[0] if isinstance(out, tuple) else out)
    return float((outputs[0] - outputs[1]).abs().max())


def python_progress(modules: dict[str, Any], method: str, inputs: Inputs, device: torch.device,
                    seconds: float = 1.0, size: int = 32) -> dict[str, float]:
    """How much Python another thread gets done while each format's forwards run back to back in a thread: a pure
    Python counter's rate then, over its rate alone (1 = the forward never holds the interpreter lock, 0 = it holds it
    throughout). The server's event loop is such a thread: it answers requests while the batch worker's forward runs."""

    def count_while(running: threading.Event) -> float:
        count, start = 0, time.perf_counter()
        while running.is_set():
            count += 1
        return count / (time.perf_counter() - start)

    idle = threading.Event()
    idle.set()
    threading.Timer(seconds, idle.clear).start()
    alone = count_while(idle)
    batch, counts = inputs(size), torch.ones(size, dtype=torch.long, device=device)  # model inputs, [B]
    out = {}
    for name, module in modules.items():
        call, running = getattr(module, method), threading.Event()

        def forwards(call: Any = call, running: threading.Event = running) -> None:
            with torch.inference_mode():
                call(*batch, counts)  # warm
                running.set()
                start = time.perf_counter()
                while time.perf_counter() - start < seconds:
                    call(*batch, counts)
                running.clear()

        thread = threading.Thread(target=forwards)
        thread.start()
        while not running.is_set() and thread.is_alive():
            time.sleep(0.001)
        out[name] = round(count_while(running) / alone, 3)
        thread.join()
    return out


def measure(modules: dict[str, Any], methods: tuple[str, ...], inputs_for: Inputs, repeats: int,
            min_seconds: float, device: torch.device) -> list[dict[str, Any]]:
    """Seconds per forward of each format at every point, interleaved; the paired ratios aoti / torchscript."""
    rows = []
    sync = torch.cuda.synchronize if device.type == "cuda" else lambda: None
    plan = [(method, inputs, samples) for method in methods for inputs, samples in POINTS]
    times: dict[tuple[str, int, int], dict[str, list[float]]] = {p: {k: [] for k in modules} for p in plan}
    with torch.inference_mode():
        for r in range(repeats):
            for method, inputs, samples in plan:
                batch = inputs_for(inputs)  # pixels [B, C, H, W], or word ids and mask [B, L]
                counts = torch.full((inputs,), samples, dtype=torch.long, device=device)  # [B]
                order = list(modules) if r % 2 == 0 else list(reversed(modules))
                for name in order:
                    call = getattr(modules[name], method)
                    times[(method, inputs, samples)][name].append(
                        seconds_per_call(lambda c=call, x=batch, n=counts: c(*x, n), 3, min_seconds, sync))
    for (method, inputs, samples), by_format in times.items():
        ratios = [a / t for a, t in zip(by_format["aoti"], by_format["torchscript"], strict=True)]
        row: dict[str, Any] = {"method": method, "inputs": inputs, "n_samples": samples}
        for name, seconds in by_format.items():
            median = statistics.median(seconds)
            row[name] = {"ms_median": round(median * 1e3, 3), "ms_min": round(min(seconds) * 1e3, 3),
                         "ms_max": round(max(seconds) * 1e3, 3), "inputs_per_s": round(inputs / median, 1)}
        row["ratio_median"] = round(statistics.median(ratios), 3)
        row["ratio_range"] = [round(min(ratios), 3), round(max(ratios), 3)]
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", type=Path, required=True, help="a version folder serving the AOTI package")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the server's pinning)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--min-seconds", type=float, default=0.4, help="per format, point and repeat")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda for a package compiled on a GPU host")
    parser.add_argument("--text-tokens", type=int, default=32, help="text models: tokens per input (all real)")
    parser.add_argument("--out", type=Path, default=None, help="results JSON")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    manifest = parse_manifest(read_document(args.version))
    modules, methods, inputs = load_both(args.version, device, args.text_tokens)
    results = {"command": " ".join([Path(sys.executable).name, *sys.argv]), "torch": torch.__version__,
               "device": str(device), "threads": args.threads, "cpu": platform.processor() or platform.machine(),
               "cpu_capability": torch.backends.cpu.get_cpu_capability(), "repeats": args.repeats,
               "text_tokens": args.text_tokens if isinstance(manifest.input, TextInput) else None,
               "same_seed_max_logit_difference": {m: agreement(modules, m, inputs, device) for m in methods},
               "python_progress_during_forward": python_progress(modules, methods[0], inputs, device),
               "rows": measure(modules, methods, inputs, args.repeats, args.min_seconds, device)}
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    print("\n".join(export_table(results)))
    print(f"same seed, largest logit difference: {results['same_seed_max_logit_difference']}")
    print(f"another thread's Python progress while the forwards run: {results['python_progress_during_forward']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
