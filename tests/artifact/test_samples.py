"""What ``GET /models`` says about drawing more than one sample, read from the export's paired NLL tables."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from artifact.contract import parse_manifest, read_document
from artifact.samples import samples_verdict

REPOSITORY = Path(__file__).resolve().parents[2] / "model_repository"


@pytest.fixture()
def image_document() -> dict[str, Any]:
    return read_document(REPOSITORY / "fashion-vit" / "1")


def nll_table(single: float, reference: float, stderr: float) -> dict[str, Any]:
    return {"1": {"nll": single, "minus_reference": single - reference, "stderr": stderr},
            "32": {"nll": reference, "minus_reference": 0.0, "stderr": 0.0}}


def test_samples_verdict_reads_what_the_export_measured(image_document: dict[str, Any]) -> None:
    """S=1 within two standard errors of S=32 (so the exporter chose S=1): samples change nothing; a default above 1
    means S=1 was measurably worse; a spread-based OOD score needs samples; no table: not measured."""
    flat = copy.deepcopy(image_document)
    flat["provenance"]["default_samples_nll"] = nll_table(0.2505, 0.2506, 0.0002)
    flat["sampling"]["default_samples"] = 1
    verdict = samples_verdict(parse_manifest(flat))
    assert verdict.informative is False
    assert "0.2505" in verdict.note and "S=32" in verdict.note and "ood_score" in verdict.note

    better = copy.deepcopy(image_document)
    better["provenance"]["default_samples_nll"] = nll_table(0.40, 0.30, 0.01)
    better["sampling"]["default_samples"] = 8
    assert samples_verdict(parse_manifest(better)).informative is True

    spread = copy.deepcopy(flat)
    spread["ood"]["score"] = "mutual_information"
    assert samples_verdict(parse_manifest(spread)).informative is True

    unmeasured = copy.deepcopy(image_document)
    unmeasured["provenance"].pop("default_samples_nll", None)
    assert samples_verdict(parse_manifest(unmeasured)).informative is None

    deterministic = copy.deepcopy(flat)
    deterministic["method"] = "deterministic"
    assert samples_verdict(parse_manifest(deterministic)).informative is False


def test_a_default_chosen_on_the_held_out_shift_says_so(image_document: dict[str, Any]) -> None:
    """S=1 within noise of S=32 on validation but not on the shift the noise was shaped on: informative, and the note
    gives the shift's figures first."""
    shaped = copy.deepcopy(image_document)
    shaped["provenance"]["default_samples_nll"] = nll_table(0.2532, 0.2520, 0.0020)
    shaped["provenance"]["noise_shape_fit"] = {"default_samples_nll_shifted": nll_table(2.5794, 2.5004, 0.0087)}
    shaped["sampling"]["default_samples"] = 16
    shaped["ood"]["selection_auroc"] = {"mutual_information": 0.7735, shaped["ood"]["score"]: 0.9956}
    shaped["ood"].pop("selection_choice", None)
    verdict = samples_verdict(parse_manifest(shaped))
    assert verdict.informative is True
    assert verdict.note.index("2.5794") < verdict.note.index("0.2532") and "held-out shift" in verdict.note
    assert "weaker OOD signal here: AUROC 0.773" in verdict.note and "0.996 for the served score" in verdict.note


def test_committed_defaults_say_that_more_samples_buy_nothing() -> None:
    """The committed DIRECTOR versions exported at S=1 with S=32 no better on validation each say so, with the
    figures their export recorded."""
    for name, version in [("fashion-vit", "4"), ("fashion-vit", "6"), ("fashion-vit", "7"),
                          ("movie-reviews-minilm", "5"), ("movie-reviews-minilm", "6"), ("writing-source-minilm", "1"),
                          ("writing-source-minilm", "2")]:
        manifest = parse_manifest(read_document(REPOSITORY / name / version))
        verdict = samples_verdict(manifest)
        assert verdict.informative is False, name
        assert manifest.provenance is not None and manifest.provenance.default_samples_nll is not None
        assert f"{manifest.provenance.default_samples_nll[1].nll:.4f}" in verdict.note and "S=32" in verdict.note


def test_the_shaped_noise_version_says_more_samples_help_under_shift() -> None:
    """fashion-vit v5 chose S=16 on its held-out shift: its note gives that table's figures and says that the samples'
    disagreement is a weaker OOD signal than its served score."""
    verdict = samples_verdict(parse_manifest(read_document(REPOSITORY / "fashion-vit" / "5")))
    assert verdict.informative is True
    assert "on the held-out shift the noise was shaped on" in verdict.note and "S=16" in verdict.note
    assert "weaker OOD signal" in verdict.note
