"""The text data on the real corpus (fetched once into the cache folder) and the real fortunes package."""

import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from training.data import texts as text_data
from training.data.texts import (
    SHIFT_CORPORA,
    TextSplit,
    label_by_rating,
    load_fortunes,
    load_movie_reviews,
    load_shift_sets,
    read_vader_corpus,
)


def test_movie_review_corpus_is_the_published_one() -> None:
    rows = read_vader_corpus("movie_reviews")
    assert len(rows) == 10_605
    ratings = torch.tensor([rating for _, rating in rows])
    assert float(ratings.min()) >= -4.0 and float(ratings.max()) <= 4.0
    assert all(sentence and "&amp;" not in sentence for sentence, _ in rows)  # HTML entities decoded


def test_default_split_sizes_balance_and_disjointness() -> None:
    data = load_movie_reviews()
    assert data.labels == ["negative", "positive"]
    assert (len(data.train), len(data.val), len(data.test)) == (7041, 1000, 2000)
    for part in (data.train, data.val, data.test):
        assert part.labels.dtype == torch.long and set(part.labels.tolist()) == {0, 1}
        assert 0.45 < float(part.labels.float().mean()) < 0.55  # the corpus is close to balanced
    train, val, test = set(data.train.texts), set(data.val.texts), set(data.test.texts)
    assert len(train) == len(data.train) and not (train & val or train & test or val & test)
    labelled = label_by_rating(read_vader_corpus("movie_reviews"))
    assert len(train | val | test) == len(labelled)  # every kept sentence is in exactly one part
    by_text = dict(zip(labelled.texts, labelled.labels.tolist(), strict=True))
    assert all(by_text[t] == y for t, y in zip(data.test.texts, data.test.labels.tolist(), strict=True))


def test_split_is_deterministic_and_seeded() -> None:
    first, again, other = load_movie_reviews(), load_movie_reviews(), load_movie_reviews(split_seed=1)
    assert first.test.texts == again.test.texts and torch.equal(first.test.labels, again.test.labels)
    assert first.train.texts == again.train.texts
    assert first.test.texts != other.test.texts
    small = load_movie_reviews(val_size=100, test_size=200, train_limit=50)
    assert (len(small.train), len(small.val), len(small.test)) == (50, 100, 200)


def test_labelling_rule() -> None:
    rows = [("great", 2.0), ("bad", -1.2), ("meh", 0.5), ("slightly bad", -0.5), ("ok", 0.51), ("great", 3.0)]
    split = label_by_rating(rows)
    assert split.texts == ["great", "bad", "ok"]  # |rating| must exceed 0.5; a repeated sentence kept once
    assert split.labels.tolist() == [1, 0, 1]


def test_shift_sets_are_labelled_and_non_empty() -> None:
    shift = load_shift_sets()
    assert tuple(shift) == SHIFT_CORPORA
    sizes = {name: len(split) for name, split in shift.items()}
    assert sizes["tweets"] > 3000 and sizes["nyt_editorials"] > 2500 and sizes["amazon_reviews"] > 2500
    for split in shift.values():
        assert set(split.labels.tolist()) == {0, 1}
        assert all(isinstance(text, str) and text for text in split.texts)
    assert any("<3" in text for text in shift["tweets"].texts)  # "&lt;3" decoded


def test_real_fortunes_are_parsed() -> None:
    quotes = load_fortunes()
    assert len(quotes) > 15_000
    assert all(quote and "\n" not in quote and quote != "%" for quote in quotes)
    assert not any(quote.startswith("% ") or quote.endswith(" %") for quote in quotes)


def test_fortune_files_are_split_on_percent_lines(tmp_path: Path) -> None:
    (tmp_path / "wisdom").write_text("First quote,\n  on two lines.\n%\nSecond -- someone\n%\n\n%\n50% off\n")
    (tmp_path / "wisdom.dat").write_bytes(b"\x00\x02binary index")
    (tmp_path / "ascii-art").write_text(" /\\_/\\\n( o.o )\n%\n")
    assert load_fortunes(tmp_path) == ["First quote, on two lines.", "Second -- someone", "50% off"]
    with pytest.raises(FileNotFoundError, match="fortunes"):
        load_fortunes(tmp_path / "missing")


def test_fetch_failure_says_what_failed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(command: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(command, 1, "", "ERROR: No matching distribution found for vadersentiment")

    monkeypatch.setattr(text_data.subprocess, "run", refuse)
    expected = r"(?s)could not fetch the VADER corpus.*pip download.*No matching distribution"
    with pytest.raises(RuntimeError, match=expected):
        text_data.vader_sdist(tmp_path)


def test_a_fetch_lands_whole_by_a_rename(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """pip writes into a private folder and the sdist is renamed into the cache: a process that fetches at the same
    time (a parallel test worker) never reads a half-written file."""
    cached = text_data.vader_sdist()  # the real sdist (fetched once per machine)
    seen: list[Path] = []

    def download(command: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        into = Path(command[command.index("-d") + 1])
        seen.append(into)
        shutil.copy(cached, into / cached.name)
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(text_data.subprocess, "run", download)
    path = text_data.vader_sdist(tmp_path)
    assert path == tmp_path / "vadersentiment" / cached.name and path.read_bytes() == cached.read_bytes()
    assert seen[0].parent == path.parent and seen[0] != path.parent  # pip wrote elsewhere first
    assert sorted(p.name for p in path.parent.iterdir()) == [cached.name]  # and nothing is left behind


def test_text_split_checks_lengths() -> None:
    with pytest.raises(ValueError):
        TextSplit(["a", "b"], torch.tensor([1]))
