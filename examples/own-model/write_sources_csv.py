"""Write the walk-through's data set (docs/your-own-model.md): sentences labelled by the kind of writing they come
from (a tweet, a New York Times editorial, an Amazon product review), from the VADER corpus that works offline here
(the sdist of vadersentiment 3.3.2). Usage: ``python examples/own-model/write_sources_csv.py sources.csv``."""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

from training.data.texts import read_vader_corpus

SOURCES = {"tweets": "tweet", "nyt_editorials": "editorial", "amazon_reviews": "product review"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out", type=Path, help="the CSV to write (columns: sentence, source)")
    args = parser.parse_args()
    rows = [(text, label) for corpus, label in SOURCES.items() for text, _ in read_vader_corpus(corpus)]
    with args.out.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["sentence", "source"])
        writer.writerows(rows)
    print(f"wrote {len(rows)} sentences to {args.out}")


if __name__ == "__main__":
    main()
