"""A model's results page is rendered from its typed manifest: the committed pages of the served models come back
line for line from their versions' manifests."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from artifact.contract import parse_manifest, read_document
from training.export.model_page import render_results

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("name", ["fashion-vit", "movie-reviews-minilm"])
def test_a_committed_results_page_renders_from_its_manifest(name: str) -> None:
    page = (ROOT / "docs" / "results" / f"{name}.md").read_text()
    version = re.match(rf"# {re.escape(name)} v(\S+): results", page)
    assert version is not None
    lines = page.splitlines()
    start = lines.index("```bash") + 1
    command = "\n".join(lines[start:lines.index("```", start)])
    manifest = parse_manifest(read_document(ROOT / "model_repository" / name / version.group(1)))
    assert render_results(manifest, command, f"{name}-reliability.png") == page


def test_the_page_says_how_the_temperature_per_input_was_chosen() -> None:
    """movie-reviews-minilm v5's page gives the slope's rule, what was served and every slope's NLLs."""
    document = read_document(ROOT / "model_repository" / "movie-reviews-minilm" / "5")
    fit = document["provenance"]["temperature_fit"]["by_score"]
    page = render_results(parse_manifest(document), "c", None)
    assert f"the one with the lowest NLL on the shift, **{fit['slope']:g}**, served" in page
    lines = page.splitlines()
    table = lines[lines.index("| slope | validation NLL | minus the best | standard error | shift NLL |") + 2:]
    rows = table[:table.index("")]
    assert [row.split(" | ")[0][2:] for row in rows] == list(fit["fit"])
    untried = {**document, "provenance": {**document["provenance"], "temperature_fit": {}}}
    assert "Temperature per input" not in render_results(parse_manifest(untried), "c", None)
