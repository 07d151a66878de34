"""What the README says the default models answer is what they answer: its text request, sent over real HTTP to the
committed text default, gets the label, the confidence and the OOD flag the README quotes, and the method it says the
defaults serve is each default's manifest's (so a new default that serves another path, or answers otherwise, fails
here until the README is refreshed)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx

from artifact.contract import parse_manifest, read_document
from tests.repository_facts import MODEL_REPOSITORY, REPO_ROOT, default_version
from tests.service.conftest import copy_version, serve, settings_for

README = (REPO_ROOT / "README.md").read_text()
TEXT_MODEL = "movie-reviews-minilm"


def flat(text: str) -> str:
    return " ".join(text.split())


def test_the_readme_text_request_gets_the_answer_it_quotes(tmp_path: Path) -> None:
    request = re.search(r"-d '(\{\"model\": \"" + TEXT_MODEL + r"\".*?\})'", README)
    claim = re.search(r'That docstring is "(\w+)" at (\d+)% confidence, and flagged `"is_ood": (true|false)`',
                      flat(README))
    assert request is not None and claim is not None, "the README's text example is not where this test reads it"
    version = default_version(TEXT_MODEL)
    copy_version(MODEL_REPOSITORY / TEXT_MODEL / version, tmp_path / "repo", TEXT_MODEL, version)
    with serve(settings_for(tmp_path / "repo", tmp_path, default_model=TEXT_MODEL)) as running:
        response = httpx.post(f"{running.url}/predict", json=json.loads(request.group(1)), timeout=60)
    assert response.status_code == 200, response.text
    (answer,) = response.json()["predictions"]
    label, percent, flagged = claim.groups()
    assert answer["label"] == label
    assert round(100 * answer["confidence"]) == int(percent)
    assert answer["is_ood"] is (flagged == "true")


def test_the_method_the_readme_says_the_defaults_serve_is_theirs() -> None:
    claim = re.search(r"The defaults serve `method: (\w+)` \(fashion-vit (\d+) and movie-reviews-minilm (\d+)\)",
                      flat(README))
    assert claim is not None, "the README's sentence on what the defaults serve is not where this test reads it"
    method, vision, text = claim.groups()
    assert (vision, text) == (default_version("fashion-vit"), default_version(TEXT_MODEL))
    manifests = {name: parse_manifest(read_document(MODEL_REPOSITORY / name / default_version(name)))
                 for name in ("fashion-vit", TEXT_MODEL)}
    assert {m.method for m in manifests.values()} == {method}
    verdict = manifests[TEXT_MODEL].kernel_verdict
    hybrid = verdict.pair("hybrid", "posthoc") if verdict is not None else None
    assert hybrid is not None and not hybrid.earns  # "found its gain under the margin"
