"""What a calibrate run will do and need, printed before anything is trained (and alone with ``--dry-run``): the
family, layers and depth candidates, the parameters, tokens or patches per input, and estimates of time, memory and
disk, checked against this machine so that a run that cannot fit is refused with what to change.

The estimates count multiply-adds per layer and time them at a throughput measured here on a matrix product, so they
are orders of magnitude, not promises. Distillation also spends time outside matrix products (validation passes,
the EMA, data movement): ``OVERHEAD`` scales the matrix-product time by what the walk-through in
docs/your-own-model.md measured (30.4 min for two depths against 18 min counted from matrix products alone).
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from training.config import PipelineConfig
from training.data.images import Split
from training.data.tokens import TokenSplit
from training.families.checkpoint import Checkpoint

BYTES_FP32 = 4
BYTES_FP16 = 2
OVERHEAD = 1.7  # measured time / matrix-product time of a calibrate run (the module docstring)
IMAGE_TEACHER_CHUNK, TEXT_TEACHER_CHUNK = Split.teacher_chunk, TokenSplit.teacher_chunk  # inputs per forward
RUNTIME_BYTES = 3 * 2**29  # the interpreter, torch, tokenizers and data loaders, before any model (1.5 GiB)


def forward_bytes(chunk: int, tokens: int, dim: int, heads: int, intermediate: int) -> int:
    """The working set of one teacher forward of ``chunk`` inputs, in float32: a layer's attention scores and their
    softmax [chunk, heads, tokens, tokens], its MLP hidden layer before and after the activation [chunk, tokens,
    intermediate] and a few [chunk, tokens, dim] states. Layers run one after another, so one layer's set bounds it;
    the teacher's statistics pass adds the mixture variance, taken one head at a time (a few [chunk, tokens, dim]
    tensors in float64), which fits inside it."""
    return chunk * (2 * heads * tokens**2 + 2 * tokens * intermediate + 4 * tokens * dim) * BYTES_FP32


@dataclass
class Plan:
    family: str
    modality: str
    layers: int
    depths: list[int]
    parameters: int
    tokens: int  # per input: patches (+ class token) or max_length
    train_inputs: int
    seconds_teacher: float  # one pass of the teacher over the training inputs (start states, statistics)
    seconds_epoch: float  # one distillation epoch at the first depth (an epoch's cost grows with K)
    epochs: int
    memory_bytes: int
    disk_bytes: int
    memory_available: int
    disk_available: int
    data_summary: str

    @property
    def seconds_total(self) -> float:
        per_depth = [self.seconds_epoch * self.epochs * k / self.depths[0] for k in self.depths]
        return self.seconds_teacher * len(self.depths) + sum(per_depth)

    def problems(self) -> list[str]:
        """What will not fit on this machine, each with what to change."""
        out = []
        if self.memory_bytes > self.memory_available:
            out.append(f"memory: about {gib(self.memory_bytes)} needed, {gib(self.memory_available)} available; "
                       "use fewer training inputs (--set data.train_limit=N), shorter texts (text.max_length) or a "
                       "machine with more memory")
        if self.disk_bytes > self.disk_available:
            out.append(f"disk: about {gib(self.disk_bytes)} needed, {gib(self.disk_available)} free where the run "
                       "and the repository are written; free space or point --run-dir / --repository elsewhere")
        return out

    def render(self) -> str:
        lines = [
            "plan",
            f"  family            {self.family} ({self.modality}), {self.layers} layers, "
            f"{self.parameters / 1e6:.1f}M parameters",
            f"  per input         {self.tokens} {'patches' if self.modality == 'image' else 'tokens (at most)'}",
            f"  depth candidates  K in {self.depths} (the last K transitions diffused; the best validation NLL "
            "is exported)",
            f"  training inputs   {self.train_inputs}",
            f"  time (estimate)   teacher pass {duration(self.seconds_teacher)} per depth, distillation "
            f"{duration(self.seconds_epoch)} per epoch at K={self.depths[0]}; about {duration(self.seconds_total)} "
            f"in all for {self.epochs} epochs at each depth",
            f"  memory (estimate) {gib(self.memory_bytes)} (available {gib(self.memory_available)})",
            f"  disk (estimate)   {gib(self.disk_bytes)} (free {gib(self.disk_available)})",
        ]
        return self.data_summary.rstrip() + "\n\n" + "\n".join(lines)


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**28 else f"{n / 2**20:.0f} MiB"


def duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def measured_flops(threads: int | None) -> float:
    """Multiply-adds per second of a float32 matrix product on this machine (0.2 s of work)."""
    if threads:
        torch.set_num_threads(threads)
    a, b = torch.randn(512, 512), torch.randn(512, 512)
    a @ b  # warm-up
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < 0.2:
        a @ b
        count += 1
    return count * 512**3 / (time.perf_counter() - start)


def layer_macs(tokens: int, dim: int, intermediate: int) -> float:
    """Multiply-adds of one transformer layer on one input: projections, attention scores and mixing, the MLP."""
    return tokens * (4 * dim * dim + 2 * dim * intermediate) + 2 * tokens * tokens * dim


def available_memory() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def plan_run(cfg: PipelineConfig, checkpoint: Checkpoint, parameters: int, tokens: int, train_inputs: int,
             input_bytes: int, data_summary: str, stored_bytes: int = 0) -> Plan:
    """The plan of ``cfg`` on ``checkpoint``: ``parameters`` of the backbone, ``tokens`` per input, ``train_inputs``,
    ``input_bytes`` (the inputs held in memory) and ``stored_bytes`` (the decoded inputs kept on disk instead)."""
    dim, layers = checkpoint.hidden_size, checkpoint.layers
    intermediate = int(checkpoint.config.get("intermediate_size") or checkpoint.config.get("hidden_dim")
                       or checkpoint.config.get("mlp_ratio", 4) * dim)
    depths = cfg.distil.depth_candidates or [cfg.distil.depth or layers]
    speed = measured_flops(cfg.threads)
    teacher = train_inputs * layers * layer_macs(tokens, dim, intermediate) * 1.5 / speed  # + the fp64 variance
    kernel = layer_macs(tokens, dim, int(dim * cfg.distil.kernel.mlp_ratio))
    epoch = train_inputs * depths[0] * kernel * 3 * (1 + cfg.distil.train_samples) / speed  # forward + backward
    teacher, epoch = teacher * OVERHEAD, epoch * OVERHEAD
    states = train_inputs * tokens * dim * BYTES_FP32  # X_{T-K} of every training input, cached once
    budget = cfg.distil.start_states_memory_bytes
    spilled = budget is not None and states > budget  # then on disk in float16 (training.distil.start_states)
    weights = parameters * BYTES_FP32
    chunk = IMAGE_TEACHER_CHUNK if checkpoint.family.modality == "image" else TEXT_TEACHER_CHUNK
    working = forward_bytes(chunk, tokens, dim, max(checkpoint.heads, 1), intermediate)
    # the checkpoint, the transition view, the artifact's eager and scripted copies, and the distillation's own parts
    memory = int(5 * weights + (0 if spilled else states) + input_bytes + working + RUNTIME_BYTES)
    disk = int(2 * weights + 2 * parameters * BYTES_FP16 * len(depths) + (states // 2 if spilled else 0) + stored_bytes
               + 2**27)
    target = Path(cfg.run_dir).resolve()
    while not target.exists():
        target = target.parent
    return Plan(family=checkpoint.family.name, modality=checkpoint.family.modality, layers=layers, depths=depths,
                parameters=parameters, tokens=tokens, train_inputs=train_inputs, seconds_teacher=teacher,
                seconds_epoch=epoch, epochs=cfg.distil.epochs, memory_bytes=memory, disk_bytes=disk,
                memory_available=available_memory(), disk_available=shutil.disk_usage(target).free,
                data_summary=data_summary)
