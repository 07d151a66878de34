"""The figures a model folder's README quotes for its default version are that version's manifest's: the test split's
accuracy, ECE and NLL of the served path, each path's served-score AUROC on the reported OOD sets and the flagged
shares (so an export that moves them fails here until the card is refreshed)."""

from __future__ import annotations

import re

import pytest

from artifact.contract import parse_manifest, read_document
from tests.repository_facts import MODEL_REPOSITORY, default_version

CARDS = ["movie-reviews-minilm"]
WORDS = {"two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7}


@pytest.mark.parametrize("model", CARDS)
def test_the_default_row_quotes_its_manifest(model: str) -> None:
    version = default_version(model)
    row = next((line for line in (MODEL_REPOSITORY / model / "README.md").read_text().splitlines()
                if line.startswith(f"| {version} (default) |")), None)
    assert row is not None, f"{model}/README.md has no row for version {version} marked (default)"
    manifest = parse_manifest(read_document(MODEL_REPOSITORY / model / version))
    metrics = manifest.provenance.test_metrics
    served = metrics[manifest.method] if manifest.method != "director" else \
        metrics[f"director_s{manifest.sampling.default_samples}"]
    figures = re.search(r"accuracy ([\d.]+)%, ECE ([\d.]+)%, NLL ([\d.]+)", row)
    assert figures is not None
    assert [float(x) for x in figures.groups()] == [round(100 * served["accuracy"], 2), round(100 * served["ece"], 2),
                                                      round(served["nll"], 4)]
    ood = metrics["ood"]
    aurocs = re.search(r"OOD AUROC ([\d.]+) quotes / ([\d.]+) docstrings \(the hybrid's served score ([\d.]+) / "
                       r"([\d.]+)\)", row)
    assert aurocs is not None
    expected = [ood[s]["paths_auroc"][p] for p in (manifest.method, "hybrid")
                for s in ("fortunes_quotes", "python_docstrings")]
    assert [float(x) for x in aurocs.groups()] == [round(x, 3) for x in expected]
    flags = re.search(r"flags ([\d.]+)% of test reviews, ([\d.]+)% of quotes, ([\d.]+)% of docstrings", row)
    assert flags is not None
    assert [float(x) for x in flags.groups()] == [round(100 * served["flagged_rate"], 1),
                                                  *(round(100 * ood[s]["flagged_rate"], 1)
                                                    for s in ("fortunes_quotes", "python_docstrings"))]
    assert f"`{manifest.ood.score}`" in row


def test_what_docs_method_md_says_of_the_text_default_score_holds() -> None:
    """docs/method.md, "The kernel's signal beside the exact backbone": the text default's served score is
    Mahalanobis++, the best or within a thousandth of the best candidate on each of its seven families, and its
    verdict's hybrid gains stay under the AUROC margin."""
    manifest = parse_manifest(read_document(MODEL_REPOSITORY / "movie-reviews-minilm" / "9"))
    extra = manifest.ood.model_extra or {}
    families = extra["selection_families"]
    assert manifest.ood.score == "mds_pp" and len(families) == 7
    assert all(max(f["auroc"].values()) - f["auroc"]["mds_pp"] < 1e-3 for f in families.values())
    verdict = manifest.kernel_verdict
    hybrid = verdict.pair("hybrid", "posthoc") if verdict is not None else None
    assert hybrid is not None and not hybrid.earns
    from tests.repository_facts import REPO_ROOT

    text = " ".join((REPO_ROOT / "docs" / "method.md").read_text().split())
    said = re.search(r"are beyond noise on (\w+) families but under the ([\d.]+) AUROC margin on all", text)
    assert said is not None
    gains = [c for c in hybrid.comparisons if c.metric == "auroc" and c.favours == "richer"]
    margin = float(said.group(2))
    assert len(gains) == WORDS[said.group(1)]
    assert all(c.margin == margin and c.difference < margin for c in gains)


def test_what_the_guide_says_of_the_walk_through_version_4_holds() -> None:
    """docs/your-own-model.md, "Version 4, under the three-way verdict": its served score, its AUROC on the reported
    sets and Mahalanobis++'s, and DIRECTOR's loss on random strings."""
    from tests.repository_facts import REPO_ROOT

    text = " ".join((REPO_ROOT / "docs" / "your-own-model.md").read_text().split())
    claim = re.search(r"reaches ([\d.]+) on fortunes quotes and ([\d.]+) on Python docstrings, where Mahalanobis\+\+ "
                      r"alone reaches ([\d.]+) / ([\d.]+)", text)
    assert claim is not None
    manifest = parse_manifest(read_document(MODEL_REPOSITORY / "writing-source-minilm" / "4"))
    ood = manifest.provenance.test_metrics["ood"]
    served = [ood[s]["paths_auroc"]["posthoc"] for s in ("fortunes_quotes", "python_docstrings")]
    best = [ood[s]["auroc_vs_test"]["mds_pp"] for s in ("fortunes_quotes", "python_docstrings")]
    assert [float(x) for x in claim.groups()] == [round(x, 3) for x in (*served, *best)]
    assert manifest.method == "posthoc" and "0.5 x z(RMDS) + 0.5 x z(predictive entropy)" in text
    assert manifest.ood.selection_choice == "combined (rmds w=0.5 + predictive_entropy)"
    strings = next(c for c in manifest.kernel_verdict.comparisons
                   if c.set.startswith("random character strings") and c.metric == "auroc")
    lost = re.search(r"its margin on random character strings \(AUROC (-[\d.]+)\)", text)
    assert lost is not None and strings.material_loss and round(strings.difference, 3) == float(lost.group(1))
