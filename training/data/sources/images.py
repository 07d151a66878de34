"""A user's folder of labelled images as a ``Dataset``: a folder of class folders (``root/<class>/*``) or of split
folders (``root/{train,val,test}/<class>/*``), PNG or JPEG files, converted exactly as the server converts a request's
image (``convert_image``) and kept on disk (``ImageFile``), so memory does not grow with the folder."""

from __future__ import annotations

import hashlib
import io
import json
import os
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import torch
from PIL import Image, UnidentifiedImageError

from models.image_input import IMAGE_FORMATS, convert_image, png_corruption
from training.data.image_file import ImageFile
from training.data.images import Dataset, Split
from training.data.sources.errors import DataError
from training.data.sources.folders import entries
from training.data.sources.labels import LabelLimit, Table, resolve_labels
from training.data.sources.splits import SPLIT_ALIASES, Plan, check_classes, overlap_warnings, plan_splits
from training.data.sources.summary import DataSummary, ImageStats, class_counts, label_kind


class ImageInfo(NamedTuple):
    format: str
    mode: str
    size: tuple[int, int]  # (w, h)
    digest: str
    clipped: bool  # 16-bit grey with values above 255, which PIL's conversion clips


def read_image(path: Path, channels: int, height: int, width: int) -> tuple[torch.Tensor, ImageInfo]:
    """One file as the model's input [C, H, W] (``convert_image``), decoded from its bytes like a request's image."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise DataError(f"{path}: cannot be read ({exc.strerror or exc})") from exc
    corrupt = png_corruption(data)
    if corrupt is not None:
        raise DataError(f"{path}: {corrupt}; the server refuses such files too: re-export the image or remove it")
    try:
        image = Image.open(io.BytesIO(data), formats=IMAGE_FORMATS)
        image.load()
    except Image.DecompressionBombError as exc:
        raise DataError(f"{path}: the image is too large to decode ({exc})") from exc
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        reason = "not a PNG or JPEG file" if isinstance(exc, UnidentifiedImageError) else f"{type(exc).__name__}: {exc}"
        raise DataError(f"{path} is not a readable PNG or JPEG image ({reason}). The server reads PNG and JPEG only: "
                        "convert the file or remove it (files whose name starts with '.' are skipped)") from exc
    clipped = image.mode.startswith("I") and image.getextrema()[1] > 255
    info = ImageInfo(image.format or "?", image.mode, image.size, hashlib.blake2b(data, digest_size=16).hexdigest(),
                     bool(clipped))
    return convert_image(image, channels, height, width), info


def _decode(paths: list[Path], channels: int, height: int, width: int, target: Path | None
            ) -> tuple[ImageFile, list[ImageInfo]]:
    """Decode ``paths`` into an ``ImageFile`` [N, C, H, W] at ``target`` (a temporary file when None; Pillow decodes
    outside the GIL, so threads help); the first unreadable file in order is the error."""
    out = ImageFile.create(target, len(paths), (channels, height, width))

    def one(i: int) -> ImageInfo:
        pixels, info = read_image(paths[i], channels, height, width)
        out.write(i, pixels)
        return info

    pool = ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1))
    try:
        infos = list(pool.map(one, range(len(paths))))
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return out, infos


def _stored(paths: list[Path], channels: int, height: int, width: int, store: Path | None
            ) -> tuple[ImageFile, list[ImageInfo]]:
    """``_decode``, kept in ``store`` under a key of the files' names, sizes and modification times and the target
    shape, so later stages of a run read the decoded file instead of decoding again."""
    if store is None:
        return _decode(paths, channels, height, width, None)
    key = hashlib.sha256(f"{channels}x{height}x{width}".encode())
    for path in paths:
        stat = path.stat()
        key.update(f"\n{path.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}".encode())
    name = key.hexdigest()[:20]
    pixels, index = store / f"{name}.u8", store / f"{name}.json"
    if pixels.is_file() and index.is_file():
        infos = [ImageInfo(f, m, (w, h), d, c) for f, m, (w, h), d, c in json.loads(index.read_text())]
        return ImageFile(pixels, len(infos), (channels, height, width)), infos
    partial = pixels.with_suffix(".partial")
    out, infos = _decode(paths, channels, height, width, partial)
    partial.replace(pixels)
    index.write_text(json.dumps([list(info) for info in infos]))
    return ImageFile(pixels, len(infos), (channels, height, width)), infos


def _image_layout(root: Path) -> tuple[dict[str, Path], str]:
    """The given split folders (split -> folder) and a description of the layout."""
    if not root.is_dir():
        raise DataError(f"{root} is not a folder: give a folder of class folders (root/<class>/*) or of split folders "
                        "(root/train/<class>/*, optionally root/val and root/test)")
    listed = entries(root)
    names = {p.name for p in listed if p.is_dir()}
    if "train" not in names:
        stray = sorted(names & {"val", "validation", "test"})
        if stray:
            raise DataError(f"{root} holds {stray[0]}/ but no train/ folder: put the training images in "
                            f"{root / 'train'}/<class>/, or use one folder per class and no split folders")
        files = [p for p in listed if not p.is_dir()]
        if files:
            raise DataError(f"{files[0]} is a file at the top of the image folder {root}: images go in class folders "
                            f"({root}/<class>/<image>)")
        if not listed:
            raise DataError(f"{root} holds no class folders: put each class's images in {root}/<class>/")
        return {"train": root}, f"image folder {root} (one folder per class)"
    other = [p for p in listed if p.name not in SPLIT_ALIASES or p.name == "dev" or not p.is_dir()]
    if other:
        raise DataError(f"{root} holds a train/ folder, so it is read as split folders (train, val or validation, "
                        f"test), but it also holds {other[0].name!r}: move it into a split's class folder or away")
    if {"val", "validation"} <= names:
        raise DataError(f"{root} holds both val/ and validation/: keep one")
    splits = {SPLIT_ALIASES[p.name]: p for p in listed}
    given = ", ".join(f"{p.name}/" for p in splits.values())
    return splits, f"image folder {root} (split folders {given})"


def _class_folders(split_folders: dict[str, Path]) -> dict[str, list[Path]]:
    """Each split folder's class folders (split -> folders); a split folder holds class folders only."""
    class_folders = {split: [p for p in entries(folder)] for split, folder in split_folders.items()}
    for split, folders in class_folders.items():
        if not folders:
            raise DataError(f"the {split} folder {split_folders[split]} holds no class folders: put its images in "
                            f"{split_folders[split]}/<class>/")
        for path in folders:
            if not path.is_dir():
                raise DataError(f"{path} is a file in the split folder {split_folders[split]}: images go in class "
                                f"folders ({split_folders[split]}/<class>/<image>)")
    return class_folders


def _class_files(folder: Path, limit: int | None, seed: int) -> list[Path]:
    files = []
    for path in entries(folder):
        if path.is_dir():
            raise DataError(f"{path} is a folder inside the class folder {folder}: a class folder holds image files "
                            "only")
        files.append(path)
    if not files:
        raise DataError(f"empty class: the class folder {folder} holds no images; add images or remove the folder")
    if limit is not None and len(files) > limit:
        keep = torch.randperm(len(files), generator=torch.Generator().manual_seed(seed))[:limit]
        files = [files[int(i)] for i in torch.sort(keep).values]
    return files


def _labelled_files(root: Path, class_folders: dict[str, list[Path]], labels: list[str] | None,
                    limit_per_class: int | None, seed: int, label_limit: LabelLimit | None = None
                    ) -> tuple[dict[str, list[Path]], dict[str, torch.Tensor], list[str], str]:
    """Each split's files and their class indices [N], by one label rule over every class folder's name, with the
    class names and how the folder names were read (refused past ``label_limit`` before any image is listed)."""
    every = [folder for folders in class_folders.values() for folder in folders]
    names = Table(str(root), every, [f.name for f in every], places=[f"class folder {f}" for f in every])
    if label_limit is not None:
        label_limit.add_table(names)
    (folder_index,), label_names, kind = resolve_labels([names], labels)
    class_of = dict(zip(every, folder_index.tolist(), strict=True))
    paths: dict[str, list[Path]] = {}
    targets: dict[str, torch.Tensor] = {}
    for split, folders in class_folders.items():
        files = [(f, class_of[folder]) for folder in folders for f in _class_files(folder, limit_per_class, seed)]
        paths[split] = [f for f, _ in files]
        targets[split] = torch.tensor([c for _, c in files], dtype=torch.long)  # [N]
    return paths, targets, label_names, kind


def _decode_splits(plan: Plan, paths: dict[str, list[Path]], targets: dict[str, torch.Tensor], channels: int,
                   height: int, width: int, store: Path | None
                   ) -> tuple[dict[str, Split], list[ImageInfo], dict[str, list[str]]]:
    """The planned splits decoded, every file's ``ImageInfo``, and each split's file digests (to find duplicates)."""
    splits, infos, keys = {}, [], {}
    for name, (source, rows) in plan.rows.items():
        images, split_infos = _stored([paths[source][int(i)] for i in rows], channels, height, width, store)
        splits[name] = Split(images, targets[source][rows])
        infos += split_infos
        keys[name] = [info.digest for info in split_infos]
    return splits, infos, keys


def load_image_folder(root: Path, channels: int, height: int, width: int, labels: list[str] | None,
                      val_fraction: float = 0.1, test_fraction: float = 0.1, seed: int = 0,
                      limit_per_class: int | None = None, store: Path | None = None,
                      label_limit: LabelLimit | None = None) -> tuple[Dataset, DataSummary]:
    """A folder of labelled images as a ``Dataset``: ``root/<class>/*`` (val and test carved out) or
    ``root/{train,val,test}/<class>/*`` (a missing val or test carved out of train). Class folders are class names
    or integer indices (see ``resolve_labels``); ``labels`` are the checkpoint's names in index order.
    ``limit_per_class`` keeps a seeded sample of that many files per class folder; ``label_limit`` refuses more
    distinct classes than it allows. The images stay on disk (``ImageFile``): in ``store``, where a later call with the
    same files finds them decoded, or in temporary files."""
    if channels not in (1, 3):
        raise ValueError(f"channels must be 1 (L) or 3 (RGB), got {channels}")
    root = Path(root).expanduser()
    split_folders, layout = _image_layout(root)
    class_folders = _class_folders(split_folders)
    paths, targets, label_names, kind = _labelled_files(root, class_folders, labels, limit_per_class, seed,
                                                        label_limit)
    train_folder = split_folders["train"]
    check_classes(targets["train"], label_names, str(train_folder),
                  f"add a folder {train_folder}/<class>/ with images of each class")
    plan = plan_splits(targets, len(label_names), val_fraction, test_fraction, seed,
                       {split: str(folder) for split, folder in split_folders.items()})
    splits, infos, keys = _decode_splits(plan, paths, targets, channels, height, width, store)
    data = Dataset(splits["train"], splits["val"], splits["test"], label_names)
    warnings = overlap_warnings(keys, {name: s.labels for name, s in splits.items()}, "image files")
    clipped = sum(info.clipped for info in infos)
    if clipped:
        warnings.append(f"{clipped} images are 16-bit grey with values above 255: PIL's conversion (the server's too) "
                        "clips them at 255, losing their contrast; save them as 8-bit images")
    summary = DataSummary(layout, label_names, label_kind(kind, "folder names"),
                          {name: class_counts(s.labels, len(label_names)) for name, s in splits.items()},
                          plan.origins, images=_image_stats(infos, (channels, height, width)), warnings=warnings)
    return data, summary


def _image_stats(infos: list[ImageInfo], target: tuple[int, int, int]) -> ImageStats:
    sizes = Counter(info.size for info in infos)
    (common, count), = sizes.most_common(1)
    widths = [w for w, _ in sizes]
    heights = [h for _, h in sizes]
    return ImageStats(len(infos), dict(Counter(i.format for i in infos)), dict(Counter(i.mode for i in infos)),
                      (min(widths), max(widths)), (min(heights), max(heights)), common, count,
                      sum(info.size != (target[2], target[1]) for info in infos), target)
