"""The kernel's three-way verdict: each branch of ``export.method: auto`` on known comparisons (DIRECTOR, the hybrid,
the post-hoc path), the paired intervals on known scores, and the whole export on tiny models: on a backbone fitted
for 8 epochs (53% validation accuracy) a kernel trained for zero steps (the identity mean map at the observed variance,
skipping both layers) loses as DIRECTOR, but its error (how far the skipped layers move each input) is an OOD signal
that earns the hybrid its place over the post-hoc path; the same run with ``export.method: posthoc`` serves the
backbone's own forward; on the same backbone fitted for 2 epochs (14%) that identity kernel is better than the barely
trained layers it skips, measured beyond noise and margin, and DIRECTOR is served. The runs are seeded on one CPU
thread, so they repeat."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from artifact.contract import KernelVerdict, VerdictComparison
from artifact.verdict import PathPair
from models.uncertainty import summarize
from tests.conftest import export_zero_step_kernel
from training.config import ExportConfig
from training.export.verdict import (
    PATH_NAMES,
    PathFigures,
    as_path_comparison,
    compare_paths,
    comparison,
    decide,
    path_pair,
)
from training.posthoc.ood_selection import ScoreInputs

MARGINS = ExportConfig()


def nll_row(difference: float, ci: tuple[float, float], posthoc: float = 0.5) -> VerdictComparison:
    return comparison("held-out shift", "nll", posthoc + difference, posthoc, ci, margin=0.02 * posthoc,
                      counts_for_kernel=True)


def test_a_gain_beyond_noise_and_margin_with_no_loss_serves_director() -> None:
    rows = [nll_row(-0.05, (-0.07, -0.03)),
            comparison("validation", "ece", 0.02, 0.021, (-0.004, 0.002), margin=0.01)]
    verdict = decide(rows, "auto", MARGINS)
    assert verdict.kernel_wins and verdict.served == "director"
    assert rows[0].practical and "earns its place" in verdict.sentence
    assert "so this version serves DIRECTOR" in verdict.sentence


def test_a_gain_under_the_practical_margin_serves_the_posthoc_path() -> None:
    """Beyond noise but 0.003 NLL on 0.5 (0.6%, the margin is 2%): not worth the kernel."""
    rows = [nll_row(-0.003, (-0.005, -0.001))]
    verdict = decide(rows, "auto", MARGINS)
    assert rows[0].favours == "director" and not rows[0].practical
    assert not verdict.kernel_wins and verdict.served == "posthoc"
    assert "adds nothing worth its cost" in verdict.sentence and "under its margin" in verdict.sentence


def test_a_loss_beyond_noise_and_margin_serves_the_posthoc_path_even_beside_a_gain() -> None:
    rows = [nll_row(-0.05, (-0.07, -0.03)),
            comparison("photo patches", "auroc", 0.90, 0.95, (-0.07, -0.03), margin=0.01)]
    verdict = decide(rows, "auto", MARGINS)
    assert rows[1].favours == "posthoc" and rows[1].material_loss
    assert not verdict.kernel_wins and verdict.served == "posthoc"
    assert "worse beyond noise and its margin on AUROC on photo patches" in verdict.sentence


def test_a_loss_beyond_noise_but_within_its_margin_does_not_veto_a_gain() -> None:
    """0.006 NLL on 0.45 (1.3%, the size is 2%) is practically equivalent: the worst-family AUROC gain of 0.06
    stands, and the sentence still names the small loss."""
    rows = [comparison("families", "worst_auroc", 0.96, 0.90, (0.05, 0.07), margin=0.01, counts_for_kernel=True),
            comparison("validation with typos", "nll", 0.456, 0.450, (0.001, 0.011), margin=0.02 * 0.450,
                       counts_for_kernel=True)]
    verdict = decide(rows, "auto", MARGINS)
    assert rows[1].favours == "posthoc" and not rows[1].material_loss
    assert verdict.kernel_wins and verdict.served == "director"
    assert "worse beyond noise but within its margin on NLL on validation with typos" in verdict.sentence


def test_a_gain_on_a_measure_that_does_not_count_for_the_kernel_is_not_practical() -> None:
    """ECE on validation and a single family's AUROC are shown, and can veto, but only the named measures earn the
    kernel its place."""
    rows = [comparison("validation", "ece", 0.01, 0.05, (-0.05, -0.03), margin=0.01),
            comparison("photo patches", "auroc", 0.99, 0.90, (0.07, 0.11), margin=0.01)]
    assert all(r.favours == "director" and not r.practical for r in rows)
    assert decide(rows, "auto", MARGINS).served == "posthoc"


def test_an_explicit_method_is_served_whatever_the_verdict_and_the_sentence_says_so() -> None:
    losing = [comparison("photo patches", "auroc", 0.90, 0.95, (-0.07, -0.03), margin=0.01)]
    forced = decide(losing, "director", MARGINS)
    assert forced.served == "director" and not forced.kernel_wins
    assert "export.method asked for director, so it serves DIRECTOR" in forced.sentence
    winning = [nll_row(-0.05, (-0.07, -0.03))]
    plain = decide(winning, "posthoc", MARGINS)
    assert plain.served == "posthoc" and plain.kernel_wins
    assert "export.method asked for posthoc" in plain.sentence


def test_the_worst_family_auroc_gain_needs_its_margin() -> None:
    small = comparison("families", "worst_auroc", 0.905, 0.90, (0.001, 0.009), margin=0.01, counts_for_kernel=True)
    large = comparison("families", "worst_auroc", 0.93, 0.90, (0.02, 0.04), margin=0.01, counts_for_kernel=True)
    assert small.favours == "director" and not small.practical
    assert large.practical


def inputs_from(logits: torch.Tensor) -> ScoreInputs:
    return ScoreInputs(summarize(logits[None]))  # [1, N, C] -> one sample


def test_paired_comparisons_of_identical_paths_favour_neither() -> None:
    """The same probabilities and scores on both paths: every difference is 0 and no interval excludes it."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(200, 3, generator=gen) * 2  # [N, C]
    labels = torch.randint(0, 3, (200,), generator=gen)
    scores = torch.randn(200, generator=gen)  # [N]
    figures = PathFigures(inputs_from(logits), scores, inputs_from(logits),
                          {"far": torch.randn(80, generator=gen) + 2, "near": torch.randn(80, generator=gen)})
    rows = compare_paths(figures, figures, labels, labels, "rotated validation", {"far": "far set"},
                         ExportConfig(verdict_bootstrap=50), seed=0)
    assert {(r.set, r.metric) for r in rows} >= {("validation", "nll"), ("rotated validation", "ece"),
                                                  ("far set", "auroc"), ("near", "fpr95"),
                                                  ("OOD-validation families, worst case", "worst_auroc")}
    assert all(r.difference == 0 and r.favours == "neither" for r in rows)
    assert not decide(rows, "auto", MARGINS).kernel_wins


def test_a_path_with_better_probabilities_wins_the_nll_comparison() -> None:
    gen = torch.Generator().manual_seed(1)
    labels = torch.randint(0, 3, (300,), generator=gen)
    sharp = torch.nn.functional.one_hot(labels, 3).float() * 4  # [N, C] confident and right
    flat = torch.zeros(300, 3)  # uniform
    scores = torch.randn(300, generator=gen)
    families = {"far": torch.randn(80, generator=gen) + 3}
    good, poor = (PathFigures(inputs_from(x), scores, inputs_from(x), families) for x in (sharp, flat))
    rows = compare_paths(good, poor, labels, labels, "shift", {}, ExportConfig(verdict_bootstrap=50), seed=0)
    nll = next(r for r in rows if r.metric == "nll" and r.set == "validation")
    assert nll.favours == "director" and nll.practical
    verdict = decide(rows, "auto", MARGINS)
    assert verdict.kernel_wins and verdict.served == "director"


def test_where_the_kernel_wins_auto_serves_director(tiny_export: tuple[Path, Path], tmp_path: Path) -> None:
    # the tiny config fits its backbone for 2 epochs: the session's run has that very fit, which this run resumes
    _, folder = export_zero_step_kernel(tmp_path, fit_epochs=2, fitted=tiny_export[0].parent / "run")
    manifest = json.loads((folder / "manifest.json").read_text())
    verdict = manifest["kernel_verdict"]
    assert manifest["method"] == "director" and verdict["served"] == "director" and verdict["kernel_wins"]
    assert any(row["practical"] for row in verdict["comparisons"])
    assert not any(row["material_loss"] for row in verdict["comparisons"])
    assert manifest["artifact"]["input_scores"][0] == "kernel_error"


def pair(richer: str, cheaper: str, rows: list[VerdictComparison]) -> PathPair:
    return path_pair(richer, cheaper, [as_path_comparison(r) for r in rows])


GAIN = nll_row(-0.05, (-0.07, -0.03))
NOTHING = nll_row(-0.001, (-0.01, 0.008))
LOSS = comparison("photo patches", "auroc", 0.90, 0.95, (-0.07, -0.03), margin=0.01)


def test_three_way_auto_serves_the_richest_path_that_earns_its_place_over_every_cheaper_one() -> None:
    """DIRECTOR needs a gain over the post-hoc path and over the hybrid; the hybrid a gain over the post-hoc path;
    otherwise the post-hoc path. A forced method is served whatever the verdict, and the sentence says so."""
    cases = [  # (DIRECTOR - post-hoc, hybrid - post-hoc, DIRECTOR - hybrid) -> served
        ((GAIN, GAIN, GAIN), "director"),
        ((GAIN, GAIN, NOTHING), "hybrid"),
        ((GAIN, NOTHING, LOSS), "posthoc"),
        ((NOTHING, GAIN, LOSS), "hybrid"),
        ((NOTHING, LOSS, NOTHING), "posthoc"),
        ((LOSS, GAIN, GAIN), "hybrid"),
    ]
    for (director_posthoc, hybrid_posthoc, director_hybrid), served in cases:
        pairs = [pair("hybrid", "posthoc", [hybrid_posthoc]), pair("director", "hybrid", [director_hybrid])]
        verdict = decide([director_posthoc], "auto", MARGINS, pairs=pairs)
        assert verdict.served == served, (director_posthoc, hybrid_posthoc, director_hybrid)
        assert verdict.pair("hybrid", "posthoc") is not None and "the hybrid" in verdict.sentence
        assert verdict.sentence.endswith(f"serves {PATH_NAMES[served]}.")
    forced = decide([GAIN], "hybrid", MARGINS, pairs=[pair("hybrid", "posthoc", [NOTHING]),
                                                      pair("director", "hybrid", [GAIN])])
    assert forced.served == "hybrid" and "export.method asked for hybrid" in forced.sentence


def test_a_kernel_trained_for_zero_steps_serves_its_error_beside_the_backbone(hybrid_export: tuple[Path, Path]
                                                                              ) -> None:
    _, folder = hybrid_export
    manifest = json.loads((folder / "manifest.json").read_text())
    verdict = KernelVerdict.model_validate(manifest["kernel_verdict"])
    assert manifest["method"] == "hybrid" and verdict.served == "hybrid" and verdict.requested == "auto"
    assert not verdict.kernel_wins and any(row.material_loss for row in verdict.comparisons)
    hybrid_pair, director_pair = verdict.pair("hybrid", "posthoc"), verdict.pair("director", "hybrid")
    assert hybrid_pair is not None and hybrid_pair.earns and director_pair is not None and not director_pair.earns
    assert all(name in verdict.sentence for name in ("DIRECTOR", "the hybrid", "the post-hoc path"))
    assert manifest["sampling"]["depth"] == 0 and "variance" not in manifest
    assert manifest["artifact"]["input_scores"][0] == "kernel_error"
    assert "kernel_error" in {manifest["ood"]["score"], *(t["score"] for t in manifest["ood"].get("combination", []))}
    agreement = manifest["provenance"]["test_metrics"]["hybrid"]["label_agreement_with_backbone"]
    assert agreement == 1.0


def test_the_hybrid_artifact_gives_the_backbone_labels_and_the_kernel_error(hybrid_export: tuple[Path, Path]
                                                                            ) -> None:
    """The served file's rows are the backbone's own logits, bit for bit its run folder's post-hoc file's, and its
    scores lead with the kernel error; DIRECTOR's file and the post-hoc file stay in the run folder."""
    from training.config import load_config
    from training.data.images import load_dataset
    from training.loading import load_backbone
    from training.posthoc.writing import load_scripted

    config, folder = hybrid_export
    cfg = load_config(config)
    hybrid, posthoc = load_scripted(folder / "director.ts"), load_scripted(Path(cfg.run_dir) / "posthoc.ts")
    data = load_dataset(cfg.data.dataset, cfg.data.root, cfg.data.val_size, cfg.data.split_seed,
                        cfg.data.train_limit, cfg.data.test_limit)
    pixels = data.test.images[:64]  # [64, 1, 28, 28]
    ones = torch.ones(64, dtype=torch.long)
    rows, scores = hybrid.scored_rows(pixels, ones)  # [64, C], [64, F]
    assert torch.equal(rows, posthoc.sample_rows(pixels, ones))
    with torch.no_grad():
        assert torch.equal(rows.argmax(-1), load_backbone(cfg.run_dir).eval()(pixels).argmax(-1))
    assert scores.shape[0] == 64 and bool((scores[:, 0] > 0).all())
    assert (Path(cfg.run_dir) / "director.ts").is_file() and (Path(cfg.run_dir) / "hybrid.ts").is_file()


def test_posthoc_asked_is_served_and_the_sentence_says_it_was_asked(posthoc_export: tuple[Path, Path]) -> None:
    _, folder = posthoc_export
    manifest = json.loads((folder / "manifest.json").read_text())
    verdict = manifest["kernel_verdict"]
    assert manifest["method"] == "posthoc" and verdict["served"] == "posthoc" and verdict["requested"] == "posthoc"
    assert not verdict["kernel_wins"] and "export.method asked for posthoc" in verdict["sentence"]
    assert manifest["sampling"]["depth"] == 0 and "variance" not in manifest
    assert manifest["artifact"]["input_scores"] is None or "kernel_error" not in manifest["artifact"]["input_scores"]


def test_the_posthoc_artifact_is_the_backbone_forward(posthoc_export: tuple[Path, Path]) -> None:
    """The served file returns the backbone's own logits, one row repeated per sample; DIRECTOR's file stays in the
    run folder."""
    from training.config import load_config
    from training.data.images import load_dataset
    from training.loading import load_backbone
    from training.posthoc.writing import load_scripted

    config, folder = posthoc_export
    cfg = load_config(config)
    module = load_scripted(folder / "director.ts")
    data = load_dataset(cfg.data.dataset, cfg.data.root, cfg.data.val_size, cfg.data.split_seed,
                        cfg.data.train_limit, cfg.data.test_limit)
    pixels = data.val.images[:6]  # [6, 1, 28, 28]
    backbone = load_backbone(cfg.run_dir).eval()
    rows = module.sample_rows(pixels, torch.tensor([1, 2, 1, 3, 1, 1]))  # [9, C]
    with torch.no_grad():
        expected = backbone(pixels)  # [6, C]
    assert torch.allclose(rows[:1], expected[:1], atol=1e-4)
    assert torch.equal(rows[1], rows[2]) and torch.allclose(rows[1], expected[1], atol=1e-4)
    assert (Path(cfg.run_dir) / "director.ts").is_file() and (Path(cfg.run_dir) / "posthoc.ts").is_file()
    page = (Path(cfg.export.docs_dir) / f"{cfg.export.name}.md").read_text()
    assert "## What the kernel adds: DIRECTOR against the post-hoc path" in page
    assert "post-hoc path: the backbone with the same post-hoc tools (served)" in page
    manifest = json.loads((folder / "manifest.json").read_text())  # the export's calibration split's figures
    decisions = manifest["provenance"]["test_metrics"]["decisions"]
    assert decisions["calibration_inputs"] == manifest["conformal"]["n"]
    assert f"| 90% | {decisions['sets']['0.9']['coverage']:.2%} " in page
