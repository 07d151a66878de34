"""The offline OOD text sets: real sentences from the machine's own files, none of them movie reviews."""

from __future__ import annotations

from pathlib import Path

import pytest

from training.data.ood_texts import load_docstring_sentences, load_license_sentences, sentences


def test_sentences_split_and_filter_by_length() -> None:
    text = "Short one. This sentence has exactly six words!  And   this\nspans   lines, fine? No."
    assert sentences(text) == ["This sentence has exactly six words!", "And this spans lines, fine?"]
    assert sentences("one two three four five. six") == ["one two three four five."]


def test_licence_and_docstring_sets_are_large_distinct_and_deduplicated() -> None:
    licences, docstrings = load_license_sentences(), load_docstring_sentences()
    assert len(licences) >= 500 and len(docstrings) >= 1000  # the sizes the movie-review config draws
    assert len(set(licences)) == len(licences) and len(set(docstrings)) == len(docstrings)
    assert not set(licences) & set(docstrings)
    assert any("License" in s for s in licences) and any("return" in s.lower() for s in docstrings)


def test_a_missing_licence_folder_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="base-files"):
        load_license_sentences(tmp_path / "absent")
