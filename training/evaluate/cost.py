"""What a method costs at inference: parameters, latency per input and peak memory, measured in the same run
for every method so they can be reported as ratios to the deterministic backbone.

Latency is one input per forward at the method's sample count (what a lone request pays), median over inputs, the
methods timed in turn on each input; a
DIRECTOR with the backbone's last transitions is timed through ``scored_rows``, the kernel error included.
Peak memory on CPU is the rise of the process's peak resident set (``VmHWM``) during the forwards, measured in
a fresh child process that loads the saved model (a TorchScript file, or a pickled eager module for models that
do not script, such as the transformers-based text baselines) and a saved batch of real inputs; the peak is
reset through ``/proc/self/clear_refs`` after loading and one warm-up forward. Inputs are a tuple of tensors:
``(pixels,)`` for images, ``(input_ids, attention_mask)`` for texts.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Hashable, Mapping
from pathlib import Path
from typing import TypeVar

import torch

from training.posthoc.ood_selection import returns_input_scores
from training.posthoc.writing import save_scripted, script_module

_CHILD = r"""
import json, re, sys, warnings
warnings.filterwarnings("ignore")
import torch
model_path, inputs_path, n_samples, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
torch.set_num_threads(threads)
if model_path.endswith(".ts"):
    model = torch.jit.load(model_path, map_location="cpu")
else:
    # a module pickled by the parent just before, in a folder only it can write (save_model_file)
    model = torch.load(model_path, map_location="cpu", weights_only=False)
model = model.eval()
inputs = torch.load(inputs_path, weights_only=True)
def status(key):
    return int(re.search(key + r":\s+(\d+) kB", open("/proc/self/status").read()).group(1)) * 1024
with torch.inference_mode():
    model(*[x[:1] for x in inputs], n_samples)
    before = status("VmRSS")
    open("/proc/self/clear_refs", "w").write("5")
    model(*inputs, n_samples)
print(json.dumps({"peak_bytes": max(0, status("VmHWM") - before)}))
"""

Inputs = tuple[torch.Tensor, ...]
K = TypeVar("K", bound=Hashable)  # what names a timed entry


def parameter_count(module: torch.nn.Module) -> int:
    """Stored weights: parameters and buffers (DIRECTOR's text embedding tables are buffers, the backbone's are
    parameters; counting only parameters would hide them on one side)."""
    return sum(p.numel() for p in module.parameters()) + sum(b.numel() for b in module.buffers())


@torch.inference_mode()
def latencies_per_input_ms(timed: Mapping[K, tuple[torch.nn.Module, int]], singles: list[Inputs],
                           repeats: int = 1) -> dict[K, float]:
    """Median wall time of one served forward of one input, per ``timed`` entry (a model and its sample count),
    after one warm-up forward each. The entries are timed in turn on each input rather than one after another, so
    a machine that slows down or speeds up during the timings moves every entry alike and the ratios hold."""
    for model, n_samples in timed.values():
        served_forward(model, singles[0], n_samples)
    times: dict[K, list[float]] = {key: [] for key in timed}
    for _ in range(repeats):
        for inputs in singles:
            for key, (model, n_samples) in timed.items():
                start = time.perf_counter()
                served_forward(model, inputs, n_samples)
                times[key].append(time.perf_counter() - start)
    return {key: 1000.0 * statistics.median(values) for key, values in times.items()}


def served_forward(model: torch.nn.Module, inputs: Inputs, n_samples: int) -> torch.Tensor:
    """The forward a server runs: ``scored_rows`` (the sampled rows and the kernel error) for a DIRECTOR that carries
    the backbone's last transitions, so its latency includes the kernel error's extra layer; ``forward`` otherwise."""
    if returns_input_scores(model):
        repeats = torch.full((inputs[0].shape[0],), n_samples, dtype=torch.long)  # [B]
        return model.scored_rows(*inputs, repeats)[0]  # [B*S, C]
    return model(*inputs, n_samples)  # [S, B, C]


def save_model_file(model: torch.nn.Module, folder: Path, name: str, script: bool) -> Path:
    """Where the memory probe loads ``model`` from: ``<name>.ts`` (TorchScript) or ``<name>.pt`` (a pickled eager
    module, for models that do not script), written again on every call. A pickle can only be loaded whole (it runs
    what it names), so it goes into a fresh folder only this user can write (``mkdtemp``, mode 0700) inside
    ``folder``: the probe unpickles what this process just wrote, never a file someone left in the run folder."""
    folder.mkdir(parents=True, exist_ok=True)
    if script:
        path = folder / f"{name}.ts"
        save_scripted(script_module(model), path)
    else:
        path = Path(tempfile.mkdtemp(prefix="probe-", dir=folder)) / f"{name}.pt"
        torch.save(model, path)
    return path


def peak_memory_bytes(model_file: Path, inputs: Inputs, n_samples: int, threads: int = 1) -> int:
    """Peak extra resident memory of one forward of ``inputs`` at ``n_samples``, in a fresh process."""
    inputs_file = model_file.with_suffix(".inputs.pt")
    torch.save(tuple(x.contiguous() for x in inputs), inputs_file)
    root = Path(__file__).resolve().parents[1]  # pickled modules import models.* in the child
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([sys.executable, "-c", _CHILD, str(model_file), str(inputs_file), str(n_samples),
                          str(threads)], capture_output=True, text=True, timeout=600, check=False, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"memory probe failed for {model_file}: {out.stderr.strip()[-500:]}")
    return int(json.loads(out.stdout.strip().splitlines()[-1])["peak_bytes"])
