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

# The constants below are fitted to two quiet runs of the guide's walk-through (docs/your-own-model.md: MiniLM, both
# cores, nothing else running; `python -m benchmarks.calibrate_estimates`, docs/benchmarks-calibrate-estimates.md): all
# 10,478 training sentences (fit-backbone 5.7 min, distillation 7.0, export 3.8) and 150 per source (360 training
# sentences: 15 s, 21 s, 49 s), so that each stage's estimate is within 5% of both.
# share of the matrix-product throughput each stage's forwards and backwards reach
EFFICIENCY = {"fit": 0.70, "teacher": 0.875, "distil": 0.91, "export": 0.9}
EPOCH_BASE = 0.75  # an epoch's work besides its K steps (readout, validation, the EMA), in steps: 3.7 / 2.35 min
# what a stage does whatever its size (loading, tokenising, scripting and checking the artifact, writing the version),
# as multiply-adds at the measured throughput, so they stretch with the machine's load as the rest does. The export's
# is a tiny random BERT's run (tests/training/calibrate/test_depth_search.py): 4.0-4.1 s on the quiet machine (14
# units) when the export weighed two paths over three text families; with three paths, seven families and the
# max-softmax floor it took 7.9 s quiet (about 40 units); 32 sits between that and a loaded run's stretch
# (docs/benchmarks-calibrate-estimates.md was measured with 14)
FIXED_WORK = {"fit": 1.0 * 1.4e10, "distil": 0.5 * 1.4e10, "export": 32.0 * 1.4e10}
# what a stage does whatever its data's size but in proportion to its backbone's (loading and saving the checkpoint,
# the teacher's step statistics, gathered once per run), in forwards of one input
FIXED_FORWARDS = {"fit": 1270.0, "distil": 1940.0}
# full forwards of each validation and test input the export makes (the three paths, the noise fit, the default S's
# draws, the thresholds' draw at the largest S), and of each input of the OOD sets it scores (every path's draws and
# scores): the hybrid adds the post-hoc path's share, about 3 and 1
EXPORT_PASSES = 16.8
OOD_PASSES = 5.4


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
    held_out: int  # validation and test inputs
    ood: int  # inputs of the OOD sets the export scores (its OOD-validation families and the reported sets)
    tau_inputs: int  # validation inputs of the tau choice, two passes (distil.tau_images, at most validation's size)
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
    fit += FIXED_FORWARDS["fit"] * forward / speed

    def teacher(k: int) -> float:  # the prefix over the training inputs, and tau on validation
        return (work.train + work.tau_inputs) * forward * (work.layers - k + 1) / work.layers / (
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
    distil += FIXED_WORK["distil"] / speed * len(work.depths) + FIXED_FORWARDS["distil"] * forward / speed
    export = (work.train + EXPORT_PASSES * work.held_out + OOD_PASSES * work.ood) * forward / (
        speed * EFFICIENCY["export"])
    export += FIXED_WORK["export"] / speed
    return StageSeconds(fit, teacher(first), epoch(first), distil, export)
