"""The model versions the main documents quote are real, and the ones they call the default are the default.

README.md, docs/api.md and docs/operations.md quote versions in example requests and answers (``"version": "N"``,
``"model_version": "N"``), paths (``fashion-vit/N``), prose (``fashion-vit v5``, ``fashion-vit v1-v4, v6 and v7``,
``fashion-vit version 1``, ``fashion-vit 1-9``). Each must exist in ``model_repository/``. Where a document says
which version is the default (an example answer to a request that names no version, "the default fashion-vit vN",
the baked-in range of the serving image, which holds the whole repository), it must be the one
tests/repository_facts.py reads, so exporting a new default names every example to refresh."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.repository_facts import MODEL_REPOSITORY, REPO_ROOT, default_model, default_version, published_versions

DOCS = [REPO_ROOT / "README.md", REPO_ROOT / "docs" / "api.md", REPO_ROOT / "docs" / "operations.md"]
# the test suite's tiny models (tests/service/conftest.py), whose answers docs/api.md shows and says so
TEST_ONLY_MODELS = {"tiny", "tiny-text"}
COMMITTED = sorted((p.name for p in MODEL_REPOSITORY.iterdir() if p.is_dir() and not p.name.startswith(".")),
                   key=len, reverse=True)  # longest first: fashion-vit-deterministic before fashion-vit
NAME = "(?:" + "|".join(map(re.escape, COMMITTED)) + r")(?![\w-])"
MODEL_KEY = re.compile(r'"model(?:_name)?":\s*"([^"]+)"')
VERSION_KEY = re.compile(r'"(model_version|version)":\s*"([^"]*)"')
PINS_A_VERSION = re.compile(r'"version":|\bversion=|/versions/\d')
PATH = re.compile(rf"(?<![\w-])({NAME})/(\d+)\b")
PROSE_V = re.compile(rf"(?<![\w-])({NAME})\s+(v\d+(?:-v?\d+)?(?:(?:,\s*|\s+and\s+)v\d+(?:-v?\d+)?)*)\b")
PROSE_VERSION = re.compile(rf"(?<![\w-])({NAME})\s+version\s+(\d+)\b")
# `fashion-vit` 1-9, fashion-vit 9 is committed (a model name, then a bare version or range)
PROSE_BARE = re.compile(rf"(?<![\w/-])`?({NAME})`?\s+(\d+)(?:-(\d+))?\b(?!\s*x\b)")
# "the default fashion-vit v7", "fashion-vit v9 (the default", "`fashion-vit` 1-4, the default": the last version
DEFAULT_CLAIM = re.compile(rf"\bdefault\s+`?({NAME})`?\s+(?:v|version\s+)(\d+)\b"
                           rf"|(?<![\w-])`?({NAME})`?\s+(?:v|version\s+)?(?:\d+-v?)?(\d+)(?:,\s*|\s+\()the default\b")
BAKED_RANGE = re.compile(rf"\bbaked-in\s+`?({NAME})`?\s+(\d+)-(\d+)\b")


@dataclass(frozen=True)
class Quote:
    """One version a document quotes: where, what text, which model and version."""

    path: Path
    line: int
    text: str
    model: str
    version: str

    def where(self) -> str:
        return f"{self.path.relative_to(REPO_ROOT)}:{self.line} quotes {flat(self.text)!r}"


@dataclass(frozen=True)
class Block:
    """A fenced code block: its first line number (1-based, the fence's) and its text."""

    line: int
    text: str


def flat(text: str) -> str:
    """A quote on one line, as a message prints it."""
    return " ".join(text.split())


def line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def fenced_blocks(text: str) -> list[Block]:
    blocks: list[Block] = []
    start: int | None = None
    body: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.lstrip().startswith("```"):
            if start is None:
                start, body = number, []
            else:
                blocks.append(Block(start, "\n".join(body)))
                start = None
        elif start is not None:
            body.append(line)
    return blocks


def expand(spec: str) -> list[str]:
    """``v1-v4, v6 and v7`` -> 1, 2, 3, 4, 6, 7; ``1-9`` -> 1..9."""
    versions: list[str] = []
    for low, high in re.findall(r"v?(\d+)(?:-v?(\d+))?", spec):
        versions += [str(v) for v in range(int(low), int(high or low) + 1)]
    return versions


def block_quotes(path: Path, block: Block) -> list[Quote]:
    """The versions an example request or answer names: each belongs to the block's ``model`` (the server's
    default model where the block names none, as a request naming none is served)."""
    named = MODEL_KEY.search(block.text)
    model = named.group(1) if named else default_model()
    return [Quote(path, block.line + line_of(block.text, m.start()), m.group(0), model, m.group(2))
            for m in VERSION_KEY.finditer(block.text)]


def prose_quotes(path: Path, text: str) -> list[Quote]:
    quotes = [Quote(path, line_of(text, m.start()), m.group(0), m.group(1), m.group(2)) for m in PATH.finditer(text)]
    quotes += [Quote(path, line_of(text, m.start()), m.group(0), m.group(1), v)
               for pattern in (PROSE_V, PROSE_VERSION) for m in pattern.finditer(text) for v in expand(m.group(2))]
    quotes += [Quote(path, line_of(text, m.start()), m.group(0), m.group(1), v)
               for m in PROSE_BARE.finditer(text) for v in expand(f"{m.group(2)}-{m.group(3) or m.group(2)}")]
    return quotes


def all_quotes() -> list[Quote]:
    quotes: list[Quote] = []
    for path in DOCS:
        text = path.read_text()
        quotes += prose_quotes(path, text)
        for block in fenced_blocks(text):
            quotes += block_quotes(path, block)
    return quotes


def test_the_patterns_find_the_quotes_they_are_for() -> None:
    """Each pattern on a sentence of the kind it is for, and not on numbers that are not versions."""
    doc = DOCS[0]
    found = {(q.model, q.version) for q in prose_quotes(doc, "fashion-vit v1-v3, v6 and v7, movie-reviews-minilm v5; "
                                                          "fashion-vit version 2; `fashion-vit` 1-2, and "
                                                          "model_repository/movie-reviews-minilm/4")}
    assert found == {("fashion-vit", v) for v in ("1", "2", "3", "6", "7")} | {
        ("movie-reviews-minilm", "5"), ("movie-reviews-minilm", "4")}
    assert prose_quotes(doc, "fashion-vit 28 x 28 images, fashion-vit-deterministic's 2 layers, DIRECTOR v2") == []
    block = Block(10, '{"model": "movie-reviews-minilm", "inputs": [],\n "version": "3"}')
    assert block_quotes(doc, block) == [Quote(doc, 12, '"version": "3"', "movie-reviews-minilm", "3")]
    assert DEFAULT_CLAIM.search("The default fashion-vit v7 (v6 re-exported)").group(1, 2) == ("fashion-vit", "7")
    assert DEFAULT_CLAIM.search("(`fashion-vit` 1-4, the default, and)").group(3, 4) == ("fashion-vit", "4")
    assert BAKED_RANGE.search("past the baked-in fashion-vit 1-9, which").group(1, 2, 3) == ("fashion-vit", "1", "9")


def test_the_documents_quote_versions() -> None:
    """The scan reads what it should: an empty result would pass everything below."""
    quotes = all_quotes()
    assert {q.path for q in quotes} == set(DOCS)
    assert any(q.text.startswith('"model_version"') for q in quotes)


def test_every_quoted_version_exists() -> None:
    missing = []
    for quote in all_quotes():
        if quote.model in TEST_ONLY_MODELS:
            continue
        if not (MODEL_REPOSITORY / quote.model).is_dir():
            missing.append(f"{quote.where()}: no model {quote.model!r} in model_repository/")
        elif int(quote.version) not in published_versions(quote.model):
            missing.append(f"{quote.where()}: model_repository/{quote.model}/{quote.version} is not published")
    assert not missing, "\n".join(missing)


def answers_to_unpinned_requests(path: Path) -> list[tuple[Quote, Block]]:
    """Each ``"model_version"`` of an example answer whose request (the code block before it) names no version: the
    server answered it with the model's default version."""
    blocks = fenced_blocks(path.read_text())
    found = []
    for before, block in zip(blocks, blocks[1:], strict=False):
        if '"model_version"' in block.text and not PINS_A_VERSION.search(before.text):
            found += [(q, before) for q in block_quotes(path, block) if q.text.startswith('"model_version"')]
    return found


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_answers_to_requests_naming_no_version_come_from_the_default_version(path: Path) -> None:
    wrong = [f"{q.where()}, the answer to the request at line {request.line}, which names no version: the default "
             f"{q.model} version is {default_version(q.model)}; paste a real answer of it"
             for q, request in answers_to_unpinned_requests(path)
             if q.model not in TEST_ONLY_MODELS and q.version != default_version(q.model)]
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_the_version_a_document_calls_the_default_is_the_default(path: Path) -> None:
    text = path.read_text()

    def where(m: re.Match[str]) -> str:
        return f"{path.relative_to(REPO_ROOT)}:{line_of(text, m.start())} quotes {flat(m.group(0))!r}"

    wrong = []
    for m in DEFAULT_CLAIM.finditer(text):
        model, version = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
        if version != default_version(model):
            wrong.append(f"{where(m)}: the default is {model} {default_version(model)}")
    for m in BAKED_RANGE.finditer(text):  # the serving image bakes the whole model_repository/
        model, published = m.group(1), published_versions(m.group(1))
        if expand(f"{m.group(2)}-{m.group(3)}") != [str(v) for v in published]:
            wrong.append(f"{where(m)}: the image bakes the whole model_repository/, {model} "
                         f"{published[0]}-{published[-1]}")
    assert not wrong, "\n".join(wrong)


def test_answers_to_predict_requests_naming_no_model_come_from_the_default_model() -> None:
    """README's request names no model: its answer must be the default model's, the one `make serve` serves."""
    checked = []
    for path in DOCS:
        for quote, request in answers_to_unpinned_requests(path):
            if "/predict" in request.text and not MODEL_KEY.search(request.text):
                checked.append(quote)
                assert quote.model == default_model(), f"{quote.where()} of {quote.model}, not {default_model()}"
    assert any(q.path == DOCS[0] for q in checked), "README.md shows no answer to its /predict request"
