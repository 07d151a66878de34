"""What a calibrate run will do and need, printed before anything is trained (and alone with ``--dry-run``): the
family, layers and depth candidates, the parameters, tokens or patches per input, and estimates of time (each stage:
``training.calibrate.estimate``), memory and disk, checked against this machine so that a run that cannot fit is
refused with what to change. The run prints the estimates beside what it measured at its end.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from training.calibrate.estimate import StageSeconds, Work, layer_macs, measured_flops, stage_seconds
from training.calibrate.preview import DataPreview
from training.config import PipelineConfig
from training.data.images import Split
from training.data.ood_families import IMAGE_FAMILIES, TEXT_FAMILIES
from training.data.tokens import TokenSplit
from training.families.checkpoint import Checkpoint

BYTES_FP32 = 4
BYTES_FP16 = 2
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
    seconds: StageSeconds
    probe: int | None  # epochs each depth candidate is probed for (None: every candidate to the end)
    epochs: int
    memory_bytes: int
    disk_bytes: int
    memory_available: int
    disk_available: int
    data_summary: str

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

    def search_words(self) -> str:
        """The distillation's part of the time line: its teacher pass and epoch, and what the depth search runs."""
        seconds, first = self.seconds, self.depths[0]
        words = f"teacher pass {duration(seconds.teacher)}, {duration(seconds.epoch)} per epoch at K={first}"
        if self.probe is not None:
            return f"{words}; each K probed {epochs(self.probe)}, the best to {self.epochs}"
        return f"{words}; {self.epochs} epochs at each depth"

    def render(self) -> str:
        lines = [
            "plan",
            f"  family            {self.family} ({self.modality}), {self.layers} layers, "
            f"{self.parameters / 1e6:.1f}M parameters",
            f"  per input         {self.tokens} {'patches' if self.modality == 'image' else 'tokens (at most)'}",
            f"  depth candidates  K in {self.depths} (the last K transitions diffused; the best validation NLL "
            "is exported)",
            f"  training inputs   {self.train_inputs}",
            f"  time (estimate)   about {duration(self.seconds.total)}: fit-backbone {duration(self.seconds.fit)}, "
            f"distillation {duration(self.seconds.distil)} ({self.search_words()}), export "
            f"{duration(self.seconds.export)}",
            f"  memory (estimate) {gib(self.memory_bytes)} (available {gib(self.memory_available)})",
            f"  disk (estimate)   {gib(self.disk_bytes)} (free {gib(self.disk_available)})",
        ]
        return self.data_summary.rstrip() + "\n\n" + "\n".join(lines)


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**28 else f"{n / 2**20:.0f} MiB"


def epochs(n: int) -> str:
    return f"{n} epoch" + ("" if n == 1 else "s")


def duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def available_memory() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def search_probe(cfg: PipelineConfig, depths: list[int]) -> int | None:
    """The epochs each depth candidate is probed for (``training.calibrate.depth_search``), None when every one is
    distilled to the end."""
    probe = cfg.distil.probe_epochs
    return probe if len(depths) > 1 and probe is not None and probe < cfg.distil.epochs else None


def run_work(cfg: PipelineConfig, checkpoint: Checkpoint, preview: DataPreview, depths: list[int]) -> Work:
    """What the run computes (``training.calibrate.estimate``), at the inputs' typical length."""
    dim = checkpoint.hidden_size
    tokens = preview.typical_tokens or preview.tokens
    # the sets the export scores: the OOD-validation families (training.data.ood_families) and the two reported sets
    families = IMAGE_FAMILIES if checkpoint.family.modality == "image" else TEXT_FAMILIES
    ood = families * cfg.export.ood_validation_images + 2 * cfg.evaluate.ood_images
    fit_epochs = 0 if checkpoint.has_head else cfg.fit.epochs
    return Work(layers=checkpoint.layers, layer=layer_macs(tokens, dim, intermediate_size(checkpoint)),
                kernel=layer_macs(tokens, dim, int(dim * cfg.distil.kernel.mlp_ratio)), train=preview.train_inputs,
                held_out=preview.held_out, ood=ood, tau_inputs=2 * min(cfg.distil.tau_images, preview.val_inputs),
                fit_passes=3.0 if cfg.fit.train == "all" else 1.0,
                fit_epochs=fit_epochs, depths=depths, probe=search_probe(cfg, depths), epochs=cfg.distil.epochs,
                train_samples=cfg.distil.train_samples)


def intermediate_size(checkpoint: Checkpoint) -> int:
    return int(checkpoint.config.get("intermediate_size") or checkpoint.config.get("hidden_dim")
               or checkpoint.config.get("mlp_ratio", 4) * checkpoint.hidden_size)


def plan_run(cfg: PipelineConfig, checkpoint: Checkpoint, parameters: int, preview: DataPreview) -> Plan:
    """The plan of ``cfg`` on ``checkpoint`` (``parameters`` of the backbone) for the data ``preview`` read."""
    dim, layers, tokens, train_inputs = checkpoint.hidden_size, checkpoint.layers, preview.tokens, preview.train_inputs
    depths = cfg.distil.depth_candidates or [cfg.distil.depth or layers]
    work = run_work(cfg, checkpoint, preview, depths)
    seconds = stage_seconds(work, measured_flops(cfg.threads))
    states = train_inputs * tokens * dim * BYTES_FP32  # X_{T-K} of every training input, cached once per depth run
    budget = cfg.distil.start_states_memory_bytes
    spilled = budget is not None and states > budget  # then on disk in float16 (training.distil.start_states)
    held = 2 if work.probe is not None else 1  # a probe keeps the best depth's run in memory beside the next one's
    weights = parameters * BYTES_FP32
    chunk = IMAGE_TEACHER_CHUNK if checkpoint.family.modality == "image" else TEXT_TEACHER_CHUNK
    working = forward_bytes(chunk, tokens, dim, max(checkpoint.heads, 1), intermediate_size(checkpoint))
    # the checkpoint, the transition view, the artifact's eager and scripted copies, and the distillation's own parts
    memory = int((3 + 2 * held) * weights + (0 if spilled else held * states) + preview.input_bytes + working
                 + RUNTIME_BYTES)
    disk = int(2 * weights + 2 * parameters * BYTES_FP16 * len(depths) + (states // 2 if spilled else 0)
               + preview.stored_bytes + 2**27)
    target = Path(cfg.run_dir).resolve()
    while not target.exists():
        target = target.parent
    return Plan(family=checkpoint.family.name, modality=checkpoint.family.modality, layers=layers, depths=depths,
                parameters=parameters, tokens=tokens, train_inputs=train_inputs, seconds=seconds, probe=work.probe,
                epochs=cfg.distil.epochs, memory_bytes=memory, disk_bytes=disk, memory_available=available_memory(),
                disk_available=shutil.disk_usage(target).free, data_summary=preview.summary)
