"""How long each stage of a calibrate run should take, from the work it does: multiply-adds of the backbone's layers
and of the kernel, timed at a throughput measured here on a matrix product (``measured_flops``), scaled by what runs
on this project's 2-core machine measured (``EFFICIENCY``: the share of that throughput the stage's own forwards and
backwards reach, with their Python, data movement and validation passes), plus the fixed seconds a stage spends
whatever its size (loading, scripting the artifact, writing the version: ``FIXED_WORK``).

The run prints these estimates beside what it measured at its end (``training.calibrate.stage``), so a user sees how
far to trust them; docs/your-own-model.md says how close they came on the walk-through and on a tiny run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

# share of the matrix-product throughput each stage reaches, from the walk-through in docs/your-own-model.md (MiniLM,
# 10,478 sentences, 1 thread on this 2-core machine beside other jobs): fit-backbone 9.3 min for two epochs, the teacher
# pass about 2 min per depth, a distillation epoch 2.35 min at K = 1 and 3.7 min at K = 2, the export's passes
EFFICIENCY = {"fit": 0.75, "teacher": 0.7, "distil": 0.73, "export": 0.9}
EPOCH_BASE = 0.75  # an epoch's work besides its K steps (readout, validation, the EMA), in steps: 3.7 / 2.35 min
# what a stage does whatever its size (loading, tokenising, scripting and checking the artifact, writing the version),
# as multiply-adds at the measured throughput: seconds on a tiny model times the throughput measured beside them, so
# they stretch with the machine's load as the rest does
FIXED_WORK = {"fit": 1.0 * 1.4e10, "distil": 0.5 * 1.4e10, "export": 27.0 * 1.4e10}
# full forwards of each held-out set the export makes (both paths, scores, S draws). 9 before it drew each pass once;
# on the timed walk-through (docs/benchmarks-calibrate.md) its export took 0.59 of the estimate made with 9 and its fit
# 0.77 (the load when the plan timed its matrix product): 0.59 / 0.77 of that work is the training pass and 6.5 of these
EXPORT_PASSES = 6.5
TAU_INPUTS = 2000  # validation inputs of the tau choice (two passes of distil.tau_images)


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


def layer_macs(tokens: float, dim: int, intermediate: int) -> float:
    """Multiply-adds of one transformer layer on one input: projections, attention scores and mixing, the MLP."""
    return tokens * (4 * dim * dim + 2 * dim * intermediate) + 2 * tokens * tokens * dim


@dataclass
class Work:
    """What a calibrate run computes, in the units the estimate counts."""

    layers: int
    layer: float  # multiply-adds of one backbone layer on one input, at the inputs' typical length
    kernel: float  # multiply-adds of one kernel step on one input
    train: int  # training inputs
    held_out: int  # validation and test inputs, and the OOD sets the export scores
    fit_passes: float  # forward-equivalents per training input per fit epoch (3: forward and backward; 1: head only)
    fit_epochs: int
    depths: list[int]  # the candidates
    probe: int | None  # epochs each candidate is probed for (None: every candidate to the end)
    epochs: int
    train_samples: int


@dataclass
class StageSeconds:
    fit: float
    teacher: float  # the teacher's pass over the training inputs at the first depth (tau, start states)
    epoch: float  # one distillation epoch at the first depth
    distil: float  # the depth search, probes included
    export: float

    @property
    def total(self) -> float:
        return self.fit + self.distil + self.export


def stage_seconds(work: Work, speed: float) -> StageSeconds:
    """Each stage's seconds at ``speed`` multiply-adds per second (``measured_flops``)."""
    forward = work.layers * work.layer  # one input through the backbone
    fit = work.fit_epochs * work.train * forward * work.fit_passes / (speed * EFFICIENCY["fit"])
    fit += FIXED_WORK["fit"] / speed + work.held_out * forward / (speed * EFFICIENCY["fit"])  # validation and test

    def teacher(k: int) -> float:  # the prefix over the training inputs, and tau on validation
        return (work.train + TAU_INPUTS) * forward * (work.layers - k + 1) / work.layers / (
            speed * EFFICIENCY["teacher"])

    def epoch(k: int) -> float:  # the teacher's K steps with their variance, the kernel forward and backward
        per_step = 2 * work.layer + 3 * (1 + work.train_samples) * work.kernel
        return (k + EPOCH_BASE) * work.train * per_step / (speed * EFFICIENCY["distil"])

    first = work.depths[0]
    if work.probe is None or len(work.depths) < 2:
        distil = sum(teacher(k) + work.epochs * epoch(k) for k in work.depths)
    else:  # every probe, then the first candidate (the usual choice: smallest) to the end
        distil = sum(teacher(k) + work.probe * epoch(k) for k in work.depths)
        distil += (work.epochs - work.probe) * epoch(first)
    distil += FIXED_WORK["distil"] / speed * len(work.depths)
    export = (work.train + EXPORT_PASSES * work.held_out) * forward / (speed * EFFICIENCY["export"])
    export += FIXED_WORK["export"] / speed
    return StageSeconds(fit, teacher(first), epoch(first), distil, export)
