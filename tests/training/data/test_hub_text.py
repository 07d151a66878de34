"""The IMDB and CoLA loaders (``datasets`` library) on small local copies of the hub splits: columns, the seeded
validation cut, labels, formats, and clear errors. The hub itself cannot be reached here."""

from __future__ import annotations

from pathlib import Path

import datasets
import pytest

from training.config import HUB_TEXT_DATASETS, load_config
from training.data.hub_text import HUB_TEXT_TASKS, load_hub_text_task
from training.data.tokens import load_text_splits


def write_split(path: Path, text_column: str, texts: list[str], labels: list[int]) -> str:
    rows = datasets.Dataset.from_dict({text_column: texts, "label": labels})
    if path.suffix == ".parquet":
        rows.to_parquet(str(path))
    elif path.suffix == ".csv":
        rows.to_csv(str(path), index=False)
    else:
        rows.to_json(str(path), lines=True)
    return str(path)


@pytest.fixture
def imdb_files(tmp_path: Path) -> dict[str, str]:
    train = [f"review {i}: {'great' if i % 2 else 'awful'} film" for i in range(40)]
    test = [f"test review {i}: {'moving' if i % 2 else 'dull'}" for i in range(10)]
    return {"train": write_split(tmp_path / "train.parquet", "text", train, [i % 2 for i in range(40)]),
            "test": write_split(tmp_path / "test.parquet", "text", test, [i % 2 for i in range(10)])}


def test_imdb_from_local_files(imdb_files: dict[str, str]) -> None:
    data = load_hub_text_task("imdb", val_size=8, split_seed=3, data_files=imdb_files)
    assert data.labels == ["negative", "positive"]
    assert (len(data.train), len(data.val), len(data.test)) == (32, 8, 10)
    assert set(data.train.texts).isdisjoint(data.val.texts)  # the validation cut comes out of train
    assert set(data.train.texts) | set(data.val.texts) == {f"review {i}: {'great' if i % 2 else 'awful'} film"
                                                           for i in range(40)}
    assert data.test.texts[0] == "test review 0: dull" and data.test.labels.tolist()[:2] == [0, 1]
    for split in (data.train, data.val):  # every label still belongs to its text
        for text, label in zip(split.texts, split.labels.tolist(), strict=True):
            assert ("great" in text) == bool(label)
    again = load_hub_text_task("imdb", val_size=8, split_seed=3, data_files=imdb_files)
    assert again.val.texts == data.val.texts  # seeded
    other = load_hub_text_task("imdb", val_size=8, split_seed=4, data_files=imdb_files)
    assert other.val.texts != data.val.texts


def test_cola_from_jsonl_and_csv(tmp_path: Path) -> None:
    sentences = ["The cat sat.", "Cat the sat.", "She reads books.", "Books she reads the."]
    for suffix in (".jsonl", ".csv"):
        files = {"train": write_split(tmp_path / f"train{suffix}", "sentence", sentences * 3, [1, 0, 1, 0] * 3),
                 "test": write_split(tmp_path / f"val{suffix}", "sentence", sentences, [1, 0, 1, 0])}
        data = load_hub_text_task("cola", val_size=2, data_files=files, train_limit=5, test_limit=3)
        assert data.labels == ["unacceptable", "acceptable"]
        assert (len(data.train), len(data.val), len(data.test)) == (5, 2, 3)
    assert HUB_TEXT_TASKS["cola"].test_split == "validation"  # GLUE's CoLA test split has no labels


def test_bad_local_copies_are_refused_clearly(tmp_path: Path, imdb_files: dict[str, str]) -> None:
    with pytest.raises(ValueError, match="lacks the columns"):  # CoLA wants `sentence`, IMDB has `text`
        load_hub_text_task("cola", val_size=2, data_files=imdb_files)
    unlabelled = write_split(tmp_path / "test-unlabelled.parquet", "text", ["a", "b"], [-1, -1])
    with pytest.raises(ValueError, match="unlabelled test split"):
        load_hub_text_task("imdb", val_size=2, data_files={"train": imdb_files["train"], "test": unlabelled})
    with pytest.raises(ValueError, match="exactly 'train' and 'test'"):
        load_hub_text_task("imdb", val_size=2, data_files={"train": imdb_files["train"]})
    with pytest.raises(ValueError, match="unknown hub text task"):
        load_hub_text_task("sst2", val_size=2, data_files=imdb_files)
    with pytest.raises(ValueError, match="leaves no training data"):
        load_hub_text_task("imdb", val_size=40, data_files=imdb_files)


def test_the_pipeline_reads_them_through_its_config(tmp_path: Path, imdb_files: dict[str, str]) -> None:
    for config in ("configs/imdb_minilm.yaml", "configs/cola_minilm.yaml"):
        cfg = load_config(config, {"data.files": imdb_files, "data.val_size": 4})
        assert cfg.is_text and cfg.data.dataset in HUB_TEXT_TASKS
    cfg = load_config("configs/imdb_minilm.yaml", {"data.files": imdb_files, "data.val_size": 4})
    train, val, test, labels = load_text_splits(cfg.data.dataset, cfg.data.val_size, cfg.data.split_seed,
                                                cfg.data.train_limit, cfg.data.test_limit, cfg.text.data_cache,
                                                cfg.data.files)
    assert (len(train), len(val), len(test), labels) == (36, 4, 10, ["negative", "positive"])


def test_local_files_for_a_task_that_ignores_them_are_refused(imdb_files: dict[str, str]) -> None:
    with pytest.raises(ValueError, match="data.files"):
        load_config("configs/movie_reviews_minilm.yaml", {"data.files": imdb_files})
    assert set(HUB_TEXT_DATASETS) == set(HUB_TEXT_TASKS)  # the config check and the loaders agree
