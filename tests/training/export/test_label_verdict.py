"""The multi-label verdict's comparisons on known probabilities: paired per input (accuracy at each path's thresholds,
binary NLL summed over labels) and by paired bootstrap (the mean label ECE), each gain or loss judged by the
single-label rule. The whole export's verdict is checked on tiny multi-label models in
tests/training/calibrate/test_multi_label.py."""

from __future__ import annotations

import torch

from training.config import ExportConfig
from training.export.label_paths import right_decisions
from training.export.label_verdict import labelled_comparisons
from training.export.verdict import decide
from training.multi_label_metrics import mean_label_ece

MARGINS = ExportConfig(verdict_bootstrap=100)


def labelled(n: int = 600, labels: int = 3, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Indicators [N, C] and calibrated probabilities [N, C] that mostly agree with them."""
    gen = torch.Generator().manual_seed(seed)
    truth = (torch.rand(n, labels, generator=gen) < 0.4).long()  # [N, C]
    probs = torch.where(truth.bool(), 0.8, 0.2) + 0.05 * torch.randn(n, labels, generator=gen)  # [N, C]
    return truth, probs.clamp(0.01, 0.99)


def by_metric(rows: list) -> dict[str, object]:
    return {c.metric: c for c in rows}


def test_a_sharper_calibrated_path_gains_on_the_shift() -> None:
    """DIRECTOR's probabilities nearer the truth than the post-hoc path's: its NLL gain is beyond noise and the 2%
    margin, a gain that counts on the held-out shift, so ``auto`` serves DIRECTOR."""
    truth, blurred = labelled()
    sharp = torch.where(truth.bool(), 0.95, 0.05)  # [N, C]
    cuts = ([0.5] * 3, [0.5] * 3)
    rows = by_metric(labelled_comparisons("validation with typos", sharp, blurred, truth, cuts, MARGINS, 0, shift=True))
    assert set(rows) == {"nll", "ece"}  # the accuracy is compared on validation only
    nll = rows["nll"]
    assert nll.favours == "director" and nll.practical and nll.counts_for_kernel
    assert nll.director < nll.posthoc and nll.ci95[1] < 0
    verdict = decide(list(rows.values()), "auto", MARGINS)
    assert verdict.served == "director" and verdict.kernel_wins


def test_the_same_probabilities_favour_neither_and_serve_the_posthoc_path() -> None:
    truth, probs = labelled()
    cuts = ([0.5] * 3, [0.5] * 3)
    rows = labelled_comparisons("validation", probs, probs.clone(), truth, cuts, MARGINS, 0, shift=False)
    assert [c.metric for c in rows] == ["accuracy", "nll", "ece"]
    assert all(c.favours == "neither" and c.difference == 0 for c in rows)
    verdict = decide(rows, "auto", MARGINS)
    assert verdict.served == "posthoc" and not verdict.kernel_wins


def test_accuracy_is_read_at_each_paths_thresholds() -> None:
    """The same probabilities, DIRECTOR's thresholds at 0.9 (it says no to every label): it is less accurate beyond
    noise, a material loss whatever else it gains (margin 0), so ``auto`` never serves it."""
    truth, probs = labelled()
    rows = labelled_comparisons("validation", probs, probs.clone(), truth, ([0.9] * 3, [0.5] * 3), MARGINS, 0,
                                shift=False)
    accuracy = by_metric(rows)["accuracy"]
    assert accuracy.director == float(right_decisions(probs, truth, [0.9] * 3).mean())
    assert accuracy.favours == "posthoc" and accuracy.material_loss
    assert decide(rows, "auto", MARGINS).served == "posthoc"
    assert by_metric(rows)["ece"].director == mean_label_ece(probs, truth)
