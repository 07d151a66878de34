"""The plan's stage estimates count what each stage passes: the OOD sets only in the export, the tau choice's
validation inputs in the teacher pass, the fixed work of loading and statistics in proportion to the backbone."""

from __future__ import annotations

import dataclasses

import pytest

from training.calibrate.estimate import Work, stage_seconds

WORK = Work(layers=6, layer=5.8e7, kernel=3.0e7, train=10_000, held_out=2_600, ood=2_500, tau_inputs=2_000,
            fit_passes=3.0, fit_epochs=2, depths=[1, 2], probe=1, epochs=4, train_samples=1)
SPEED = 1e11


def test_the_ood_sets_cost_the_export_alone() -> None:
    base, more = stage_seconds(WORK, SPEED), stage_seconds(dataclasses.replace(WORK, ood=10 * WORK.ood), SPEED)
    assert more.fit == base.fit and more.distil == base.distil and more.export > base.export


def test_the_tau_choice_reads_what_validation_holds() -> None:
    base = stage_seconds(WORK, SPEED)
    small = stage_seconds(dataclasses.replace(WORK, tau_inputs=90), SPEED)
    assert small.teacher < base.teacher and small.distil < base.distil and small.fit == base.fit


def test_a_smaller_backbone_has_less_fixed_work() -> None:
    """Loading, saving and the step statistics scale with the backbone: a backbone 1000 times smaller on one input
    is estimated far under a second per stage but for the export's scripting."""
    tiny = stage_seconds(dataclasses.replace(WORK, layer=WORK.layer / 1000, kernel=WORK.kernel / 1000, train=100,
                                             held_out=40, ood=100, tau_inputs=40), SPEED)
    assert tiny.fit < 1 and tiny.distil < 1 and 1 < tiny.export < 5
    assert stage_seconds(WORK, SPEED / 2).total == pytest.approx(2 * stage_seconds(WORK, SPEED).total)
