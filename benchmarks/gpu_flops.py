"""Raw artifact throughput at large batch x samples, with the model's FLOP/s as a share of the device's peak.

FLOPs are counted, not estimated: ``torch.utils.flop_counter`` records every matmul, convolution and attention kernel
one ``sample_rows`` call runs (TorchScript modules dispatch through the same operators), on the device measured, so
the attention kernels counted are the ones that run (the CPU's fused attention is not counted by torch; a CUDA
device's flash/efficient kernels are). The peak is the datasheet's dense tensor-core figure for the precision (bf16;
TF32 for fp32, which the server enables on CUDA) where the device is in ``PEAK_TFLOPS``, and always a measured bf16 /
TF32 matmul peak of the same device beside it.

    python benchmarks/gpu_flops.py --artifact model_repository/fashion-vit/1 --out /tmp/flops.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

# dense tensor-core TFLOP/s (no sparsity) by precision: bf16, and TF32 for fp32 matmuls; SXM parts
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "H200": {"bf16": 989.5, "fp32": 494.7},
    "H100": {"bf16": 989.5, "fp32": 494.7},
    "A100": {"bf16": 312.0, "fp32": 156.0},
    "L40S": {"bf16": 362.1, "fp32": 183.0},
    "L4": {"bf16": 121.0, "fp32": 60.0},
    "A10": {"bf16": 125.0, "fp32": 62.5},
}


def datasheet_peak(device_name: str, precision: str) -> float | None:
    """The table's TFLOP/s for the first model name found in ``device_name`` (e.g. "NVIDIA H200"), else None."""
    for model, peaks in PEAK_TFLOPS.items():
        if model in device_name.split() or f" {model}-" in f" {device_name}":
            return peaks[precision]
    return None


def sample_rows_flops(module: torch.nn.Module, pixels: torch.Tensor, repeats: torch.Tensor) -> int:
    """FLOPs of one ``sample_rows`` call (a multiply-add counts 2)."""
    with torch.inference_mode(), FlopCounterMode(display=False) as counter:
        module.sample_rows(pixels, repeats)
    return int(counter.get_total_flops())


def seconds_per_forward(module: torch.nn.Module, pixels: torch.Tensor, repeats: torch.Tensor, bf16: bool,
                        min_seconds: float) -> float:
    """Mean time of ``sample_rows`` after 3 warm-up calls, one synchronisation per timing window (not per call)."""
    device = pixels.device

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    with torch.inference_mode(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
        for _ in range(3):
            module.sample_rows(pixels, repeats)
        sync()
        calls, start = 0, time.perf_counter()
        while calls < 3 or time.perf_counter() - start < min_seconds:
            module.sample_rows(pixels, repeats)
            calls += 1
            if calls % 10 == 0:
                sync()
        sync()
        return (time.perf_counter() - start) / calls


def measured_matmul_tflops(device: torch.device, bf16: bool, size: int = 8192) -> float:
    """TFLOP/s of a square matmul on ``device`` (bf16, or fp32 under the current matmul precision)."""
    a = torch.randn(size, size, device=device, dtype=torch.bfloat16 if bf16 else torch.float32)  # [n, n]
    b = torch.randn_like(a)  # [n, n]
    for _ in range(3):
        a @ b
    torch.cuda.synchronize(device)
    start, calls = time.perf_counter(), 10
    for _ in range(calls):
        a @ b
    torch.cuda.synchronize(device)
    return 2 * size**3 * calls / (time.perf_counter() - start) / 1e12


def measure(folder: Path, batches: list[int], samples: list[int], min_seconds: float) -> dict[str, Any]:
    device = torch.device("cuda")
    torch.set_float32_matmul_precision("high")  # TF32, as the server runs fp32 on CUDA
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning)
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        module = torch.jit.load(str(folder / "director.ts"), map_location=device).eval()
    manifest = json.loads((folder / "manifest.json").read_text())
    shape = (int(manifest["input"]["channels"]), int(manifest["input"]["height"]), int(manifest["input"]["width"]))
    name = torch.cuda.get_device_name(device)
    peaks = {"bf16": measured_matmul_tflops(device, True), "fp32": measured_matmul_tflops(device, False)}
    rows = []
    for precision in ("fp32", "bf16"):
        for batch in batches:
            for s in samples:
                pixels = torch.rand(batch, *shape, device=device)  # [B, C, H, W]
                repeats = torch.full((batch,), s, dtype=torch.long, device=device)  # [B]
                flops = sample_rows_flops(module, pixels, repeats)
                seconds = seconds_per_forward(module, pixels, repeats, precision == "bf16", min_seconds)
                tflops = flops / seconds / 1e12
                sheet = datasheet_peak(name, precision)
                rows.append({"precision": precision, "batch": batch, "n_samples": s, "rows": batch * s,
                             "ms_per_forward": round(seconds * 1e3, 3), "inputs_per_s": round(batch / seconds, 1),
                             "gflops_per_forward": round(flops / 1e9, 3), "model_tflops": round(tflops, 2),
                             "share_of_datasheet_peak": None if sheet is None else round(tflops / sheet, 4),
                             "share_of_measured_matmul_peak": round(tflops / peaks[precision], 4)})
    return {"device": name, "torch": torch.__version__, "artifact": str(folder),
            "datasheet_peak_tflops": {p: datasheet_peak(name, p) for p in ("bf16", "fp32")},
            "measured_matmul_peak_tflops": {p: round(v, 1) for p, v in peaks.items()}, "rows": rows}


def precision_quality(folder: Path, images: torch.Tensor, labels: torch.Tensor, n_samples: int,
                      temperature: float) -> dict[str, Any]:
    """Accuracy, ECE and NLL of the served summary (mean of ``n_samples`` sampled probabilities) in fp32 and in bf16
    autocast on CUDA, each under the same seed, and the share of inputs whose label agrees."""
    from models.uncertainty import expected_calibration_error, summarize

    device = torch.device("cuda")
    module = torch.jit.load(str(folder / "director.ts"), map_location=device).eval()
    out: dict[str, Any] = {"n_samples": n_samples, "inputs": int(labels.shape[0])}
    predictions = {}
    for precision in ("fp32", "bf16"):
        torch.manual_seed(0)
        with torch.inference_mode(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16"):
            logits = module(images.to(device), n_samples).float().cpu()  # [S, N, C]
        summary = summarize(logits, temperature)
        probability = summary.probabilities.gather(1, labels[:, None]).squeeze(1)  # [N]
        correct = summary.prediction == labels  # [N]
        predictions[precision] = summary.prediction
        out[precision] = {"accuracy": round(float(correct.float().mean()), 4),
                          "ece": round(expected_calibration_error(summary.confidence, correct), 4),
                          "nll": round(float(-probability.clamp_min(1e-12).log().mean()), 4)}
    out["label_agreement"] = round(float((predictions["fp32"] == predictions["bf16"]).float().mean()), 4)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--artifact", type=Path, required=True, help="an image artifact's version folder")
    parser.add_argument("--batches", type=int, nargs="+", default=[256, 1024, 4096])
    parser.add_argument("--samples", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--min-seconds", type=float, default=1.0, help="timing window per point")
    parser.add_argument("--data", type=Path, default=None, help="Fashion-MNIST folder: also compare fp32 and bf16 "
                        "predictions (accuracy, ECE, NLL, label agreement) on its first --quality-images test images")
    parser.add_argument("--quality-images", type=int, default=5000)
    parser.add_argument("--out", type=Path, required=True, help="write the results as JSON here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print(f"gpu_flops: no CUDA device (torch {torch.__version__}, built for CUDA {torch.version.cuda})",
              file=sys.stderr)
        return 2
    results = measure(args.artifact, args.batches, args.samples, args.min_seconds)
    if args.data is not None:
        from training.data.images import load_fashion_mnist_split

        manifest = json.loads((args.artifact / "manifest.json").read_text())
        test = load_fashion_mnist_split(args.data, "test").head(args.quality_images)
        results["quality"] = precision_quality(args.artifact, test.images, test.labels,
                                               int(manifest["sampling"]["default_samples"]),
                                               float(manifest.get("temperature", 1.0)))
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results["rows"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
