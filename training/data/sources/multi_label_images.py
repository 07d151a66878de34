"""A user's multi-label images as a ``Dataset``: a table (CSV, TSV, JSON lines or Parquet) with a column of image
paths (relative to the table's folder, or absolute) and the labels of each image as in
``training.data.sources.multi_label`` (a column of label lists, or one 0/1 column per label). The images are
converted as the server converts a request's image and kept on disk, like an image folder's."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from training.data.images import Dataset, Split
from training.data.sources.errors import DataError
from training.data.sources.images import _image_stats, _stored, load_image_folder
from training.data.sources.labels import LabelLimit
from training.data.sources.multi_label import multi_label_summary, multi_label_targets, strata
from training.data.sources.splits import plan_splits
from training.data.sources.summary import DataSummary
from training.data.sources.text_files import TEXT_FORMATS, read_file


class MultiLabelColumns(NamedTuple):
    """Where a multi-label image table holds its images and labels."""

    image_column: str
    label_column: str  # each row's list of labels (unless label_columns)
    label_columns: list[str] | None  # one 0/1 column per label


def load_images(root: Path, shape: tuple[int, int, int], labels: list[str] | None, fractions: tuple[float, float],
                seed: int, store: Path | None, label_limit: LabelLimit | None = None,
                multi_label: MultiLabelColumns | None = None) -> tuple[Dataset, DataSummary]:
    """A user's images: a folder of class folders (``load_image_folder``), or with ``multi_label`` a table of image
    paths and their labels (``load_multi_label_images``)."""
    if multi_label is None:
        return load_image_folder(root, *shape, labels, *fractions, seed, store=store, label_limit=label_limit)
    return load_multi_label_images(Path(root).expanduser(), shape, labels, multi_label.image_column,
                                   multi_label.label_column, multi_label.label_columns, fractions, seed, store)


def image_paths(table: Path, items: list[object], column: str) -> list[Path]:
    """Each row's image file, the first missing one the error."""
    paths = []
    for i, item in enumerate(items):
        if not isinstance(item, str) or not item.strip():
            raise DataError(f"{table}, row {i + 1}: {column!r} is {item!r}, not the path of an image file")
        path = Path(item).expanduser()
        path = path if path.is_absolute() else table.parent / path
        if not path.is_file():
            raise DataError(f"{table}, row {i + 1}: the image {item!r} does not exist (paths are relative to the "
                            f"table's folder {table.parent})")
        paths.append(path)
    return paths


def load_multi_label_images(table: Path, shape: tuple[int, int, int], labels: list[str] | None, image_column: str,
                            label_column: str, label_columns: list[str] | None, fractions: tuple[float, float],
                            seed: int, store: Path | None) -> tuple[Dataset, DataSummary]:
    """The table's images [N, C, H, W] and indicators [N, C'] in train, val and test (carved out of the table,
    stratified by each image's first label), with the data summary."""
    if table.suffix.lower() not in TEXT_FORMATS:
        raise DataError(f"{table}: multi-label images are listed in a table (.csv, .tsv, .jsonl or .parquet) with a "
                        f"column {image_column!r} of image paths and the labels")
    per_column = [read_file(table, (image_column, column)) for column in label_columns or [label_column]]
    read = per_column[0]
    if label_columns:
        read.labels = [tuple(t.labels[i] for t in per_column) for i in range(len(read.items))]
    if not read.items:
        raise DataError(f"{table} holds no rows")
    targets, names, kind = multi_label_targets({"train": read}, labels, label_columns)
    paths = image_paths(table, read.items, image_column)
    plan = plan_splits({"train": strata(targets["train"])}, len(names) + 1, *fractions, seed, {"train": str(table)})
    splits, infos, counts = {}, [], {}
    for name, (_, rows) in plan.rows.items():
        images, split_infos = _stored([paths[int(i)] for i in rows], *shape, store)
        splits[name] = Split(images, targets["train"][rows])
        infos += split_infos
        counts[name] = [int(c) for c in splits[name].labels.sum(0).tolist()]
    what = f"columns {', '.join(label_columns)}" if label_columns else f"column {label_column!r}"
    summary = multi_label_summary(f"table {table}", names, kind, counts, plan.origins, what)
    summary.images = _image_stats(infos, shape)
    return Dataset(splits["train"], splits["val"], splits["test"], names), summary
