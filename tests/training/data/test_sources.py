"""A user's own labelled data (training.data.sources) on small folders and files written here: layouts, formats,
the server's image conversion, labels, seeded stratified carving, the summary, and an error for each problem."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image

from training.data.image_file import ImageFile
from training.data.sources import (
    IMAGE_CONVERSION,
    DataError,
    carve_splits,
    check_class_count,
    image_convert_fields,
    load_image_folder,
    load_text_table,
    read_image,
)

CLASSES = ["ant", "bee", "cat"]


def make_image(mode: str, size: tuple[int, int], seed: int) -> Image.Image:
    """A random image of PIL ``mode`` (L, LA, RGB, RGBA, P, P+t (a palette with a transparent colour), I;16)."""
    rng = np.random.default_rng(seed)
    w, h = size
    if mode == "I;16":
        return Image.fromarray(rng.integers(0, 256, (h, w)).astype(np.uint16))  # 16-bit grey, values within 8 bits
    rgba = rng.integers(0, 256, (h, w, 4), dtype=np.uint8)
    if mode in ("P", "P+t"):
        image = Image.fromarray(rgba[..., :3], "RGB").convert("P", palette=Image.Palette.ADAPTIVE, colors=16)
        if mode == "P+t":
            image.info["transparency"] = 0
        return image
    channels = {"L": 1, "LA": 2, "RGB": 3, "RGBA": 4}[mode]
    return Image.fromarray(rgba[..., 0] if channels == 1 else rgba[..., :channels], mode)


# (mode, format, size (w, h)): every mode the server handles, both formats, sizes smaller, equal and larger than 24x24
KINDS = [("L", "PNG", (20, 30)), ("RGB", "JPEG", (40, 40)), ("RGBA", "PNG", (16, 16)), ("P", "PNG", (33, 17)),
         ("P+t", "PNG", (24, 24)), ("L", "JPEG", (50, 20)), ("RGB", "PNG", (24, 24)), ("LA", "PNG", (30, 30)),
         ("I;16", "PNG", (28, 28)), ("RGB", "JPEG", (64, 48))]


def write_class(folder: Path, seed: int, n: int = len(KINDS)) -> list[Path]:
    folder.mkdir(parents=True)
    paths = []
    for i, (mode, fmt, size) in enumerate(KINDS[:n]):
        path = folder / f"img{i}.{'png' if fmt == 'PNG' else 'jpg'}"
        make_image(mode, size, seed * 100 + i).save(path, format=fmt, **({"quality": 90} if fmt == "JPEG" else {}))
        paths.append(path)
    return paths


@pytest.fixture
def image_root(tmp_path: Path) -> Path:
    root = tmp_path / "images"
    for c, name in enumerate(CLASSES):
        write_class(root / name, c)
    (root / "bee" / ".DS_Store").write_bytes(b"\x00\x01 not an image")  # hidden: skipped
    return root


def pixels(images: ImageFile) -> torch.Tensor:
    """Every image of a split, read from its file [N, C, H, W]."""
    return images[torch.arange(len(images))]


def rows_of(images: ImageFile) -> set[bytes]:
    return {image.numpy().tobytes() for image in pixels(images)}


def test_image_folder_with_carved_splits(image_root: Path) -> None:
    data, summary = load_image_folder(image_root, 3, 24, 24, labels=None, seed=0)
    assert data.labels == CLASSES  # folder names, sorted
    assert data.train.images.shape == (24, 3, 24, 24) and data.train.images.dtype == torch.float32
    assert data.val.images.shape == (3, 3, 24, 24) and data.test.images.shape == (3, 3, 24, 24)
    for split in (data.train, data.val, data.test):
        assert split.labels.dtype == torch.int64
        assert float(pixels(split.images).min()) >= 0.0 and float(pixels(split.images).max()) <= 1.0
    # stratified: every class in every split, in proportion (10 files: 8 / 1 / 1)
    assert summary.counts == {"train": [8, 8, 8], "val": [1, 1, 1], "test": [1, 1, 1]}
    assert sorted(data.val.labels.tolist()) == [0, 1, 2] and sorted(data.test.labels.tolist()) == [0, 1, 2]
    parts = [rows_of(s.images) for s in (data.train, data.val, data.test)]
    assert sum(map(len, parts)) == 30 and len(set.union(*parts)) == 30  # each image in exactly one split
    assert "carved from train: seed 0, fraction 0.1, stratified by class" in summary.origins["val"]
    assert summary.images is not None and summary.images.files == 30
    assert summary.images.modes == {"L": 6, "RGB": 9, "RGBA": 3, "P": 6, "LA": 3, "I;16": 3}
    assert summary.images.formats == {"PNG": 21, "JPEG": 9}
    assert summary.images.widths == (16, 64) and summary.images.heights == (16, 48)
    assert summary.images.most_common_size == (24, 24) and summary.images.most_common_count == 6
    assert summary.images.resized == 24
    again, _ = load_image_folder(image_root, 3, 24, 24, labels=None, seed=0)
    assert torch.equal(pixels(again.val.images), pixels(data.val.images))
    assert torch.equal(again.train.labels, data.train.labels)
    other, _ = load_image_folder(image_root, 3, 24, 24, labels=None, seed=1)
    assert rows_of(other.val.images) != rows_of(data.val.images) or rows_of(other.test.images) != parts[2]
    grey, _ = load_image_folder(image_root, 1, 8, 12, labels=None, limit_per_class=5)
    assert grey.train.images.shape[1:] == (1, 8, 12)
    assert len(grey.train) + len(grey.val) + len(grey.test) == 15  # 5 per class


def test_image_conversion_is_the_servers(image_root: Path) -> None:
    server = pytest.importorskip("service.engine.images")
    for path in sorted(image_root.glob("*/img*")):
        for shape in ((3, 24, 24), (1, 24, 24), (3, 20, 30)):
            ours, _ = read_image(path, *shape)
            theirs = server.image_to_tensor(path.read_bytes(), shape, 10**8, [])
            assert torch.equal(ours, theirs), (path, shape)
    assert image_convert_fields(1) == {"color": "L", "resize": "bilinear to height x width, aspect ratio not kept",
                                       "note": IMAGE_CONVERSION}


def test_split_folder_layout(tmp_path: Path) -> None:
    root = tmp_path / "images"
    for c, name in enumerate(CLASSES):
        write_class(root / "train" / name, c)
        write_class(root / "validation" / name, 10 + c, n=2)
    data, summary = load_image_folder(root, 3, 16, 16, labels=None, test_fraction=0.2)
    assert summary.counts == {"train": [8, 8, 8], "val": [2, 2, 2], "test": [2, 2, 2]}  # test carved from train
    assert summary.origins["val"] == f"given: {root / 'validation'}"
    assert summary.origins["train"].endswith("less the carved test")
    assert "fraction 0.2" in summary.origins["test"]
    assert len(data.val) == 6
    (root / "test").mkdir()  # a split folder without class folders
    with pytest.raises(DataError, match="test folder .* holds no class folders"):
        load_image_folder(root, 3, 16, 16, labels=None)


def test_image_labels_given_in_the_checkpoints_order(image_root: Path) -> None:
    data, summary = load_image_folder(image_root, 3, 16, 16, labels=["cat", "bee", "ant"])
    assert data.labels == ["cat", "bee", "ant"]
    assert summary.counts["train"] == [8, 8, 8]
    with pytest.raises(DataError, match=r"empty class: no training example of class 3 'dog'"):
        load_image_folder(image_root, 3, 16, 16, labels=["cat", "bee", "ant", "dog"])
    with pytest.raises(DataError, match=r"class folder .*bee: the label 'bee' is not one of the known labels"):
        load_image_folder(image_root, 3, 16, 16, labels=["cat", "Bees", "ant"])


def test_integer_class_folders(tmp_path: Path) -> None:
    root = tmp_path / "images"
    for c in range(3):
        write_class(root / str(c), c, n=4)
    data, _ = load_image_folder(root, 1, 8, 8, labels=["zero", "one", "two"])
    assert data.labels == ["zero", "one", "two"]
    with pytest.raises(DataError, match=r"the label '2' is not a class index in 0..1"):
        load_image_folder(root, 1, 8, 8, labels=["zero", "one"])


def test_unreadable_file_is_an_error_naming_it(image_root: Path) -> None:
    (image_root / "cat" / "notes.txt").write_text("not an image")
    with pytest.raises(DataError, match=r"notes.txt is not a readable PNG or JPEG image"):
        load_image_folder(image_root, 3, 16, 16, labels=None)
    (image_root / "cat" / "notes.txt").unlink()
    make_image("RGB", (8, 8), 0).save(image_root / "cat" / "anim.gif", format="GIF")  # readable, but not by the server
    with pytest.raises(DataError, match=r"anim.gif is not a readable PNG or JPEG"):
        load_image_folder(image_root, 3, 16, 16, labels=None)
    (image_root / "cat" / "anim.gif").unlink()
    (image_root / "cat" / "cut.png").write_bytes((image_root / "cat" / "img0.png").read_bytes()[:60])  # truncated
    with pytest.raises(DataError, match=r"cut.png is not a readable PNG or JPEG"):
        load_image_folder(image_root, 3, 16, 16, labels=None)


def test_empty_class_folder_and_stray_files(image_root: Path, tmp_path: Path) -> None:
    (image_root / "dog").mkdir()
    (image_root / "dog" / ".hidden.png").write_bytes(b"")
    with pytest.raises(DataError, match=r"empty class: the class folder .*dog holds no images"):
        load_image_folder(image_root, 3, 16, 16, labels=None)
    (image_root / "dog" / ".hidden.png").unlink()
    (image_root / "dog").rmdir()
    (image_root / "README.md").write_text("my data")
    with pytest.raises(DataError, match=r"README.md is a file at the top of the image folder"):
        load_image_folder(image_root, 3, 16, 16, labels=None)
    small = tmp_path / "small"
    for c in range(2):
        write_class(small / f"c{c}", c, n=2)  # 2 per class: nothing to carve
    with pytest.raises(DataError, match=r"the val split would be empty.*a val split of your own"):
        load_image_folder(small, 3, 8, 8, labels=None)


def test_sixteen_bit_grey_clipping_is_reported(image_root: Path) -> None:
    Image.fromarray(np.full((10, 10), 40000, dtype=np.uint16)).save(image_root / "ant" / "deep.png")
    _, summary = load_image_folder(image_root, 1, 8, 8, labels=None)
    assert any("16-bit grey" in w for w in summary.warnings)
    assert "16-bit grey" in summary.render()


def test_carve_splits_is_seeded_and_stratified() -> None:
    labels = torch.tensor([0] * 50 + [1] * 20 + [2] * 3 + [3] * 1)
    parts = carve_splits(labels, 4, {"val": 0.1, "test": 0.2}, seed=7)
    counts = {name: torch.bincount(labels[rows], minlength=4).tolist() for name, rows in parts.items()}
    assert counts == {"train": [35, 14, 1, 1], "val": [5, 2, 1, 0], "test": [10, 4, 1, 0]}
    assert torch.cat(list(parts.values())).sort().values.tolist() == list(range(len(labels)))
    again = carve_splits(labels, 4, {"val": 0.1, "test": 0.2}, seed=7)
    assert all(torch.equal(parts[n], again[n]) for n in parts)
    other = carve_splits(labels, 4, {"val": 0.1, "test": 0.2}, seed=8)
    assert not torch.equal(parts["val"], other["val"])


# --- texts ---------------------------------------------------------------------------------------------------------

def text_rows(n: int = 30) -> tuple[list[str], list[str]]:
    words = {"neg": "awful dull boring", "pos": "great moving fun"}
    labels = ["neg" if i % 3 else "pos" for i in range(n)]
    texts = [f"review {i}: {words[label]} " + "x " * i for i, label in enumerate(labels)]
    return texts, labels


def write_csv(path: Path, columns: tuple[str, str], texts: list[str], labels: list) -> Path:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle, delimiter="\t" if path.suffix == ".tsv" else ",")
        writer.writerow(columns)
        writer.writerows(zip(texts, labels, strict=True))
    return path


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_csv_with_class_names(tmp_path: Path) -> None:
    texts, labels = text_rows()
    path = write_csv(tmp_path / "data.csv", ("text", "label"), texts, labels)
    data, summary = load_text_table(str(path), seed=3)
    assert data.labels == ["neg", "pos"]
    assert (len(data.train), len(data.val), len(data.test)) == (24, 3, 3)
    assert summary.counts == {"train": [16, 8], "val": [2, 1], "test": [2, 1]}
    for split in (data.train, data.val, data.test):
        for text, label in zip(split.texts, split.labels.tolist(), strict=True):
            assert ("great" in text) == (label == 1)  # every label still belongs to its text
    assert set(data.train.texts) | set(data.val.texts) | set(data.test.texts) == set(texts)
    again, _ = load_text_table(str(path), seed=3)
    assert again.val.texts == data.val.texts and again.test.texts == data.test.texts
    given, _ = load_text_table(str(path), labels=["pos", "neg"])
    assert given.labels == ["pos", "neg"] and sorted(given.val.labels.tolist()) == [0, 1, 1]
    tsv = write_csv(tmp_path / "data.tsv", ("text", "label"), texts, [int(lab == "pos") for lab in labels])
    ints, summary = load_text_table(str(tsv), labels=["negative", "positive"])
    assert ints.labels == ["negative", "positive"] and summary.counts["train"] == [16, 8]
    assert "integer class indices" in summary.label_kind


def test_jsonl_and_parquet(tmp_path: Path) -> None:
    texts, labels = text_rows()
    ints = [int(lab == "pos") for lab in labels]
    path = write_jsonl(tmp_path / "data.jsonl", [{"text": t, "label": y, "id": i}
                                                 for i, (t, y) in enumerate(zip(texts, ints, strict=True))])
    data, summary = load_text_table(str(path))
    assert data.labels == ["0", "1"] and summary.counts["train"] == [16, 8]  # integers named by their number
    pq.write_table(pa.table({"sentence": texts, "y": labels}), tmp_path / "data.parquet")
    data, summary = load_text_table(str(tmp_path / "data.parquet"), "sentence", "y", labels=["neg", "pos"])
    assert data.labels == ["neg", "pos"] and len(data.train) == 24
    as_array = tmp_path / "array.json"
    as_array.write_text(json.dumps([{"text": t, "label": y} for t, y in zip(texts, labels, strict=True)]))
    assert load_text_table(str(as_array))[0].labels == ["neg", "pos"]


def test_save_to_disk_dataset_dict(tmp_path: Path) -> None:
    texts, labels = text_rows()
    features = datasets.Features({"text": datasets.Value("string"),
                                  "label": datasets.ClassLabel(names=["neg", "pos"])})
    ints = [int(lab == "pos") for lab in labels]
    parts = {"train": (texts[:20], ints[:20]), "validation": (texts[20:25], ints[20:25]),
             "test": (texts[25:], ints[25:]), "unsupervised": (texts[:2], [-1, -1])}
    folder = tmp_path / "saved"
    datasets.DatasetDict({name: datasets.Dataset.from_dict({"text": t, "label": y}, features=features)
                          for name, (t, y) in parts.items()}).save_to_disk(str(folder))
    data, summary = load_text_table(str(folder))
    assert data.labels == ["neg", "pos"]  # the ClassLabel's names, in its order
    assert (len(data.train), len(data.val), len(data.test)) == (20, 5, 5)
    assert set(data.val.texts) == set(texts[20:25])
    assert summary.origins["val"] == f"given: {folder} split 'validation'"
    assert any("unsupervised" in w for w in summary.warnings)
    swapped, _ = load_text_table(str(folder), labels=["pos", "neg"])  # names are matched, not positions
    assert swapped.labels == ["pos", "neg"]
    pos = [t for t, y in zip(swapped.train.texts, swapped.train.labels.tolist(), strict=True) if y == 0]
    assert pos and all("great" in t for t in pos)
    by_index, _ = load_text_table(str(folder), labels=["LABEL_0", "LABEL_1"])  # names unknown: indices
    assert by_index.train.labels.tolist() == data.train.labels.tolist()


def test_folder_of_split_files_with_custom_columns(tmp_path: Path) -> None:
    texts, labels = text_rows()
    folder = tmp_path / "splits"
    folder.mkdir()
    write_csv(folder / "train.csv", ("review", "sentiment"), texts[:24], labels[:24])
    write_csv(folder / "test.csv", ("review", "sentiment"), texts[24:], labels[24:])
    (folder / "notes.txt").write_text("not data")
    data, summary = load_text_table(str(folder), text_column="review", label_column="sentiment", val_fraction=0.25)
    assert data.test.texts and set(data.test.texts) == set(texts[24:])
    assert len(data.train) + len(data.val) == 24 and summary.counts["val"] == [4, 2]
    assert summary.origins["test"] == f"given: {folder / 'test.csv'}"
    assert "carved from train" in summary.origins["val"]
    with pytest.raises(DataError, match=r"train.csv has no column 'text'; its columns are \['review', 'sentiment'\]"):
        load_text_table(str(folder))


def test_label_errors_name_the_file_and_row(tmp_path: Path) -> None:
    texts, labels = text_rows()
    path = write_csv(tmp_path / "data.csv", ("text", "label"), texts, labels[:4] + ["Pos"] + labels[5:])
    with pytest.raises(DataError, match=r"data.csv, row 5 \(line 6\): the label 'Pos' is not one of the known labels "
                                        r"\['neg', 'pos'\] \(did you mean 'pos'\?\)"):
        load_text_table(str(path), labels=["neg", "pos"])
    rows = [{"text": t, "label": int(y == "pos")} for t, y in zip(texts, labels, strict=True)]
    rows[2]["label"] = 2
    path = write_jsonl(tmp_path / "data.jsonl", rows)
    with pytest.raises(DataError, match=r"data.jsonl, row 3 \(line 3\): the label 2 is not a class index in 0..1; "
                                        r"the known labels are \['neg', 'pos'\]"):
        load_text_table(str(path), labels=["neg", "pos"])
    rows[2]["label"] = None
    write_jsonl(path, rows)
    with pytest.raises(DataError, match=r"data.jsonl, row 3 \(line 3\): the label is missing"):
        load_text_table(str(path))
    pq.write_table(pa.table({"text": texts, "label": [0.0, float("nan")] + [1.0] * 28}), tmp_path / "nan.parquet")
    with pytest.raises(DataError, match=r"nan.parquet, row 2: the label is missing"):
        load_text_table(str(tmp_path / "nan.parquet"))


def test_text_errors(tmp_path: Path) -> None:
    texts, labels = text_rows()
    path = write_csv(tmp_path / "data.csv", ("text", "label"), texts[:6] + ["   "] + texts[7:], labels)
    with pytest.raises(DataError, match=r"data.csv, row 7 \(line 8\): the text is empty or only whitespace"):
        load_text_table(str(path))
    path = write_csv(tmp_path / "data.csv", ("body", "label"), texts, labels)
    with pytest.raises(DataError, match=r"data.csv has no column 'text'; its columns are \['body', 'label'\]"):
        load_text_table(str(path))
    with pytest.raises(DataError, match=r"the val split would be empty"):
        load_text_table(str(write_csv(tmp_path / "two.csv", ("text", "label"), ["a", "b", "c", "d"],
                                      ["x", "y", "x", "y"])))
    only_train = write_csv(tmp_path / "some.csv", ("text", "label"), texts[:10], ["neg"] * 10)
    with pytest.raises(DataError, match=r"empty class: no training example of class 1 'pos'"):
        load_text_table(str(only_train), labels=["neg", "pos"])
    with pytest.raises(DataError, match=r"missing.csv does not exist"):
        load_text_table(str(tmp_path / "missing.csv"))
    (tmp_path / "data.xlsx").write_text("x")
    with pytest.raises(DataError, match=r"cannot tell the format of .*data.xlsx"):
        load_text_table(str(tmp_path / "data.xlsx"))


def test_hub_id_unreachable(monkeypatch: pytest.MonkeyPatch) -> None:
    def offline(*args: object, **kwargs: object) -> None:
        raise ConnectionError("no internet")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(DataError, match=r"'someone/reviews' is no local file or folder, and loading it from the "
                                        r"Hugging Face hub failed \(ConnectionError: no internet\)"):
        load_text_table("someone/reviews")


def test_check_class_count() -> None:
    check_class_count(["neg", "pos"], 2, "the checkpoint's head")
    with pytest.raises(DataError, match=r"the checkpoint's head has 3 classes but the data has 2: \['neg', 'pos'\]"):
        check_class_count(["neg", "pos"], 3, "the checkpoint's head")


def test_summary_renders_counts_and_truncation(tmp_path: Path) -> None:
    texts, labels = text_rows()
    path = write_csv(tmp_path / "data.csv", ("text", "label"), texts, labels)
    whitespace = lambda batch: [len(t.split()) + 2 for t in batch]  # noqa: E731  [CLS] words [SEP]
    data, summary = load_text_table(str(path), max_characters=40, count_tokens=whitespace, max_length=12)
    splits = {"train": data.train, "val": data.val, "test": data.test}
    cut = {name: sum(len(t) > 40 for t in s.texts) for name, s in splits.items()}
    truncated = {name: sum(len(t[:40].split()) + 2 > 12 for t in s.texts) for name, s in splits.items()}
    assert summary.texts is not None and summary.texts.cut == cut and summary.texts.truncated == truncated
    assert 0 < sum(cut.values()) < 30 and 0 < sum(truncated.values()) < 30
    lengths = sorted(len(t) for t in texts)
    assert (summary.texts.characters.min, summary.texts.characters.max) == (lengths[0], lengths[-1])
    text = summary.render()
    assert f"cut at 40 characters: train {cut['train']}, val {cut['val']}, test {cut['test']}" in text
    assert f"truncated at 12 tokens: train {truncated['train']}, val {truncated['val']}, test {truncated['test']}" \
        in text
    lines = text.splitlines()
    assert any(line.split() == ["0", "neg", "16", "2", "2"] for line in lines)
    assert any(line.split() == ["1", "pos", "8", "1", "1"] for line in lines)
    assert any(line.split() == ["total", "24", "3", "3"] for line in lines)
    assert "Tokens per text (after the cut): min" in text and "Classes: 2" in text


def test_duplicates_across_splits_are_warned(tmp_path: Path) -> None:
    texts, labels = text_rows()
    folder = tmp_path / "splits"
    folder.mkdir()
    write_csv(folder / "train.csv", ("text", "label"), texts, labels)
    write_csv(folder / "val.csv", ("text", "label"), texts[:3], labels[:3])
    write_csv(folder / "test.csv", ("text", "label"), ["a new text", texts[1]], ["pos", "pos"])
    _, summary = load_text_table(str(folder))
    assert "3 texts of val also appear in train" in summary.render()
    assert any("1 texts appear under more than one label" in w for w in summary.warnings)
