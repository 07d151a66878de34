"""What a method costs at inference: parameters, latency per input and peak memory, measured in the same run
for every method so they can be reported as ratios to the deterministic backbone.

Latency is one input per forward at the method's sample count (what a lone request pays), median over inputs.
Peak memory on CPU is the rise of the process's peak resident set (``VmHWM``) during the forwards, measured in
a fresh child process that loads the scripted artifact (the peak is reset through ``/proc/self/clear_refs``
after loading); on CUDA it is ``torch.cuda.max_memory_allocated``.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

_CHILD = r"""
import json, re, sys, warnings
warnings.filterwarnings("ignore")
import torch
path, batch, n_samples, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
torch.set_num_threads(threads)
model = torch.jit.load(path, map_location="cpu").eval()
pixels = torch.rand((batch, *json.loads(sys.argv[5])))
def status(key):
    return int(re.search(key + r":\s+(\d+) kB", open("/proc/self/status").read()).group(1)) * 1024
with torch.inference_mode():
    model(pixels[:1], n_samples)
    before = status("VmRSS")
    open("/proc/self/clear_refs", "w").write("5")
    model(pixels, n_samples)
print(json.dumps({"peak_bytes": max(0, status("VmHWM") - before)}))
"""


def parameter_count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@torch.inference_mode()
def latency_per_input_ms(model: torch.nn.Module, images: torch.Tensor, n_samples: int, repeats: int = 1) -> float:
    """Median wall time of ``model(one_image, n_samples)`` over the images (after one warm-up forward)."""
    model(images[:1], n_samples)
    times = []
    for _ in range(repeats):
        for i in range(images.shape[0]):
            start = time.perf_counter()
            model(images[i : i + 1], n_samples)
            times.append(time.perf_counter() - start)
    return 1000.0 * statistics.median(times)


def peak_memory_bytes(artifact: Path, image_shape: tuple[int, ...], batch: int, n_samples: int,
                      threads: int = 1) -> int:
    """Peak extra resident memory of one forward of ``batch`` inputs at ``n_samples``, in a fresh process."""
    out = subprocess.run([sys.executable, "-c", _CHILD, str(artifact), str(batch), str(n_samples), str(threads),
                          json.dumps(list(image_shape))], capture_output=True, text=True, timeout=600, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"memory probe failed for {artifact}: {out.stderr.strip()[-500:]}")
    return int(json.loads(out.stdout.strip().splitlines()[-1])["peak_bytes"])
