"""Text data that works offline here (docs/method.md, "Data that works offline"): sentence-level sentiment from
the VADER corpus and OOD quotes.

The default text task is binary sentiment of Rotten Tomatoes movie-review sentences (10,605 sentences, each with the
mean of several human ratings on -4..4), from ``additional_resources/hutto_ICWSM_2014.tar.gz`` inside the sdist of
``vadersentiment==3.3.2``. Sentences with ``abs(rating) > 0.5`` are kept, label 1 (positive) when the rating is
above zero. The same corpus holds tweets, New York Times editorial snippets and Amazon review sentences: labelled
by the same rule, they are the domain-shift sets. The OOD text set is the quotes of the Debian package ``fortunes``.

The sdist is fetched once with pip into a cache folder (``DIRECTOR_DATA_CACHE``, else ``$XDG_CACHE_HOME/director``,
else ``~/.cache/director``) and checked against its sha256.
"""

from __future__ import annotations

import hashlib
import html
import io
import os
import re
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

SENTIMENT_LABELS = ["negative", "positive"]
VADER_VERSION = "3.3.2"
VADER_SDIST = f"vaderSentiment-{VADER_VERSION}.tar.gz"
VADER_SDIST_SHA256 = "5d7c06e027fc8b99238edb0d53d970cf97066ef97654009890b83703849632f9"
VADER_CORPUS_MEMBER = "additional_resources/hutto_ICWSM_2014.tar.gz"
# corpus name -> the ground-truth file inside hutto_ICWSM_2014.tar.gz (id <TAB> mean rating <TAB> sentence)
VADER_CORPORA = {
    "movie_reviews": "movieReviewSnippets_GroundTruth.txt",
    "tweets": "tweets_GroundTruth.txt",
    "nyt_editorials": "nytEditorialSnippets_GroundTruth.txt",
    "amazon_reviews": "amazonReviewSnippets_GroundTruth.txt",
}
SHIFT_CORPORA = ("tweets", "nyt_editorials", "amazon_reviews")
RATING_THRESHOLD = 0.5
FORTUNES_DIR = Path("/usr/share/games/fortunes")
FORTUNES_EXCLUDED = ("ascii-art",)  # pictures drawn in characters, not text


@dataclass
class TextSplit:
    """Texts and their labels int64 [N]."""

    texts: list[str]
    labels: torch.Tensor

    def __post_init__(self) -> None:
        if len(self.texts) != int(self.labels.shape[0]):
            raise ValueError(f"{len(self.texts)} texts but {int(self.labels.shape[0])} labels")

    def __len__(self) -> int:
        return len(self.texts)

    def head(self, n: int | None) -> TextSplit:
        return self if n is None else TextSplit(self.texts[:n], self.labels[:n])

    def subset(self, index: torch.Tensor) -> TextSplit:
        return TextSplit([self.texts[int(i)] for i in index], self.labels[index])


@dataclass
class TextDataset:
    train: TextSplit
    val: TextSplit
    test: TextSplit
    labels: list[str]


def data_cache_dir(cache_dir: str | Path | None = None) -> Path:
    if cache_dir is not None:
        return Path(cache_dir)
    if os.environ.get("DIRECTOR_DATA_CACHE"):
        return Path(os.environ["DIRECTOR_DATA_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "director"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def vader_sdist(cache_dir: str | Path | None = None) -> Path:
    """The ``vadersentiment==3.3.2`` sdist in the cache folder, fetched with pip the first time into a private
    folder and renamed into place, so that processes fetching it at once (parallel test workers) never read a file
    another is still writing."""
    folder = data_cache_dir(cache_dir) / "vadersentiment"
    path = folder / VADER_SDIST
    if path.exists() and _sha256(path) == VADER_SDIST_SHA256:
        return path
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="fetch-", dir=folder) as private:
        fetched = Path(private) / VADER_SDIST
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", "vadersentiment",
                   f"vadersentiment=={VADER_VERSION}", "--disable-pip-version-check", "-d", private]
        try:
            result = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
        except (OSError, subprocess.TimeoutExpired) as err:
            raise RuntimeError(f"could not fetch the VADER corpus: running `{' '.join(command)}` failed: {err}") \
                from err
        if result.returncode != 0 or not fetched.exists():
            tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-5:])
            raise RuntimeError(
                f"could not fetch the VADER corpus: `{' '.join(command)}` exited with {result.returncode} "
                f"and left no {path.name} (PyPI must be reachable, or place {VADER_SDIST} in {folder} "
                f"yourself):\n{tail}"
            )
        if _sha256(fetched) != VADER_SDIST_SHA256:
            raise RuntimeError(f"the fetched {VADER_SDIST} does not have the expected sha256 {VADER_SDIST_SHA256}")
        os.replace(fetched, path)
    return path


@lru_cache(maxsize=4)
def _vader_files(sdist: Path) -> dict[str, str]:
    """The ground-truth files of the corpus tarball nested in the sdist, decoded: {file name: text}."""
    with tarfile.open(sdist, "r:gz") as outer:
        member = next((m for m in outer.getmembers() if m.name.endswith(VADER_CORPUS_MEMBER)), None)
        if member is None:
            raise RuntimeError(f"{sdist} holds no {VADER_CORPUS_MEMBER}")
        handle = outer.extractfile(member)
        if handle is None:
            raise RuntimeError(f"{member.name} in {sdist} is not a regular file")
        inner_bytes = handle.read()
    wanted = set(VADER_CORPORA.values())
    files: dict[str, str] = {}
    with tarfile.open(fileobj=io.BytesIO(inner_bytes), mode="r:gz") as inner:
        for member in inner.getmembers():
            name = Path(member.name).name
            if name in wanted and (handle := inner.extractfile(member)) is not None:
                files[name] = handle.read().decode("utf-8")
    missing = wanted - files.keys()
    if missing:
        raise RuntimeError(f"{sdist}: the corpus tarball lacks {sorted(missing)}")
    return files


def read_vader_corpus(name: str, cache_dir: str | Path | None = None) -> list[tuple[str, float]]:
    """(sentence, mean human rating in -4..4) for every line of one corpus, in file order, HTML entities decoded."""
    if name not in VADER_CORPORA:
        raise ValueError(f"unknown corpus {name!r}; expected one of {sorted(VADER_CORPORA)}")
    text = _vader_files(vader_sdist(cache_dir))[VADER_CORPORA[name]]
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        fields = line.split("\t", 2)
        if len(fields) != 3:
            raise ValueError(f"{VADER_CORPORA[name]} line {number}: expected id, rating, sentence")
        rows.append((html.unescape(fields[2].strip()), float(fields[1])))
    return rows


def label_by_rating(rows: list[tuple[str, float]], threshold: float = RATING_THRESHOLD) -> TextSplit:
    """Keep ``abs(rating) > threshold``, label = rating > 0; exact duplicate sentences kept once (first)."""
    seen: set[str] = set()
    texts, labels = [], []
    for sentence, rating in rows:
        if abs(rating) <= threshold or not sentence or sentence in seen:
            continue
        seen.add(sentence)
        texts.append(sentence)
        labels.append(int(rating > 0))
    return TextSplit(texts, torch.tensor(labels, dtype=torch.long))


def load_movie_reviews(val_size: int = 1000, test_size: int = 2000, split_seed: int = 0,
                       cache_dir: str | Path | None = None, train_limit: int | None = None) -> TextDataset:
    """The default text task: a fixed, seeded train / validation / test split of the labelled movie-review
    sentences (each sentence in exactly one part)."""
    everything = label_by_rating(read_vader_corpus("movie_reviews", cache_dir))
    if val_size + test_size >= len(everything):
        raise ValueError(f"val_size + test_size must leave training data ({len(everything)} sentences)")
    order = torch.randperm(len(everything), generator=torch.Generator().manual_seed(split_seed))
    test = everything.subset(order[:test_size])
    val = everything.subset(order[test_size : test_size + val_size])
    train = everything.subset(order[test_size + val_size :])
    return TextDataset(train.head(train_limit), val, test, list(SENTIMENT_LABELS))


def load_shift_sets(cache_dir: str | Path | None = None) -> dict[str, TextSplit]:
    """Domain shift: tweets, NYT editorial and Amazon review sentences, labelled like the movie reviews."""
    return {name: label_by_rating(read_vader_corpus(name, cache_dir)) for name in SHIFT_CORPORA}


def load_fortunes(root: str | Path = FORTUNES_DIR, exclude: tuple[str, ...] = FORTUNES_EXCLUDED) -> list[str]:
    """The quotes of the Debian ``fortunes`` package (OOD text): every ``%``-separated entry of every fortune
    file (the files without an extension; ``.dat`` indexes and ``.u8`` links skipped), whitespace collapsed."""
    root = Path(root)
    files = sorted(p for p in root.glob("*") if p.is_file() and not p.suffix and p.name not in exclude) \
        if root.is_dir() else []
    if not files:
        raise FileNotFoundError(
            f"no fortune files in {root}: install the Debian package 'fortunes' (apt-get install fortunes)"
        )
    quotes: list[str] = []
    for path in files:
        text = path.read_bytes().decode("utf-8", errors="replace")
        for entry in re.split(r"^%[ \t]*\r?$", text, flags=re.MULTILINE):
            quote = " ".join(entry.split())
            if quote:
                quotes.append(quote)
    return quotes
