"""The offline scorer (``service.scoring.Scorer``): the server's answers for the same inputs and seed, from a dict of
arrays, a pandas DataFrame, an Arrow table or image paths, one row per input in order; a bad row costs its own line;
pickled, it loads its model again where it lands (Dask's local scheduler runs it over partitions); the segments Ray
reads hold every input still to score once, in the in-process scorer's chunks."""

from __future__ import annotations

import base64
import json
import pickle
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from service.batch_scoring import main as score_file
from service.config import Settings
from service.scoring import Scorer, ScoringError
from service.scoring.batches import Pixels
from service.scoring.inputs import Source, read_inputs
from service.scoring.segments import segment_chunks, survey
from tests.service.conftest import TEXT_MODEL, Running, random_pixels, settings_for

TEXTS = ["a warm and funny film.", "dull.", "", "a slow, beautiful and sad story about a family."]
PIXELS = random_pixels(np.random.default_rng(5), 3)  # [3][1][28][28], 4 decimals: exact in float32


def served(server: Running, model: str, inputs: list[dict[str, Any]], seed: int = 7) -> dict[str, Any]:
    body = {"model": model, "inputs": inputs, "n_samples": 4, "seed": seed}
    response = httpx.post(f"{server.url}/predict", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def as_prediction(line: dict[str, Any]) -> dict[str, Any]:
    """A line's fields that ``/predict`` returns per input."""
    common = {"key", "model", "model_version", "n_samples", "ood_score_name", "ood_threshold", "decisions"}
    return {name: value for name, value in line.items() if name not in common and value is not None}


@pytest.fixture(scope="module")
def text_scorer(text_server: Running, text_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Scorer:
    """The text server's settings (its batch token budget), so that its forwards are cut where the server's are."""
    settings = text_server.app_state.settings
    return Scorer(text_repository, TEXT_MODEL, n_samples=4, seed=7, settings=settings)


def test_texts_are_answered_as_the_server_answers_them(text_scorer: Scorer, text_server: Running) -> None:
    expected = served(text_server, TEXT_MODEL, [{"text": t} for t in TEXTS if t])["predictions"]
    batch = {"key": np.array(["a", "b", "empty", "d"]), "text": np.array(TEXTS, dtype=object)}
    columns = text_scorer({"key": batch["key"][[0, 1, 3]], "text": batch["text"][[0, 1, 3]]})
    rows = [dict(zip(columns, values, strict=True)) for values in zip(*columns.values(), strict=True)]
    assert [row["key"] for row in rows] == ["a", "b", "d"] and all(row["model_version"] == "1" for row in rows)
    for row, prediction in zip(rows, expected, strict=True):
        assert as_prediction(row) == {k: v for k, v in prediction.items() if k != "index"}  # every value, exactly
    # a bad row costs its own line; the others keep their order and are answered one by one (one request each)
    mixed = text_scorer(batch)
    assert list(mixed["key"]) == ["a", "b", "empty", "d"]
    assert mixed["status"][2] == 422 and mixed["label"][2] is None and mixed["error"][0] is None
    alone = served(text_server, TEXT_MODEL, [{"text": TEXTS[3]}])["predictions"][0]
    assert mixed["probabilities"][3] == alone["probabilities"]


def test_pandas_arrow_and_image_paths_give_the_same_rows(tiny_server: Running, tiny_repository: Path,
                                                          tmp_path: Path) -> None:
    scorer = Scorer(tiny_repository, "tiny", n_samples=4, seed=7, settings=tiny_server.app_state.settings)
    expected = served(tiny_server, "tiny", [{"pixels": p} for p in PIXELS])["predictions"]
    frame = pd.DataFrame({"key": ["x", "y", "z"], "pixels": [np.asarray(p, dtype=np.float32) for p in PIXELS]},
                         index=[10, 11, 12])
    scored = scorer(frame)
    assert isinstance(scored, pd.DataFrame) and list(scored.index) == [10, 11, 12]
    assert [as_prediction(row) for row in scored.to_dict("records")] == [
        {k: v for k, v in p.items() if k != "index"} for p in expected]
    table = scorer(pa.table({"key": ["x", "y", "z"], "pixels": [np.asarray(p).tolist() for p in PIXELS]}))
    assert table.column("probabilities").to_pylist() == list(scored["probabilities"])
    paths = []
    for i, pixels in enumerate(PIXELS):
        paths.append(tmp_path / f"{i}.png")
        Image.fromarray((np.asarray(pixels)[0] * 255).round().astype(np.uint8), mode="L").save(paths[i])
    paths.append(tmp_path / "missing.png")
    from_files = scorer({"path": np.array([str(p) for p in paths], dtype=object)})
    with_uploads = served(tiny_server, "tiny", [{"image_base64": png_base64(p)} for p in paths[:3]])["predictions"]
    assert list(from_files["key"]) == ["0", "1", "2", "3"] and from_files["status"][3] == 400
    assert list(from_files["label"][:3]) == [p["label"] for p in with_uploads]
    assert list(from_files["ood_score"][:3]) == [p["ood_score"] for p in with_uploads]
    assert scorer.columns[:2] == ["key", "model"] and scorer.columns[-2:] == ["error", "status"]


def png_base64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def test_a_pickled_scorer_loads_its_model_again(tiny_repository: Path) -> None:
    scorer = Scorer(tiny_repository, "tiny", "1", n_samples=2, seed=3, settings=Settings(torch_threads=1))
    copy = pickle.loads(pickle.dumps(scorer))
    assert copy.entry.artifact is not scorer.entry.artifact and copy.version == "1"
    item = [("k", Pixels(np.asarray(PIXELS[0], dtype=np.float32)))]
    assert copy.lines(item) == scorer.lines(item)


def test_what_a_version_cannot_answer_fails_the_scorer(tiny_repository: Path, text_repository: Path) -> None:
    settings = Settings(torch_threads=1)
    with pytest.raises(ScoringError, match="n_samples must be between 1 and"):
        Scorer(tiny_repository, "tiny", n_samples=10_000, settings=settings)
    with pytest.raises(ScoringError, match="has no version '7'"):
        Scorer(tiny_repository, "tiny", "7", settings=settings)
    with pytest.raises(ScoringError, match="'broken-text' version 1 is unavailable: sha256 mismatch"):
        Scorer(text_repository, "broken-text", settings=settings)


def test_dask_partitions_are_scored_as_the_cli_scores_chunks(text_repository: Path, tmp_path: Path) -> None:
    """Each partition is one request under the seed, as each --chunk of the CLI is: the same lines."""
    import dask.dataframe as dd

    texts = [f"{word} film, really {word}." for word in ("good", "bad", "odd", "fine", "grim", "warm")]
    source = tmp_path / "texts.jsonl"
    source.write_text("".join(json.dumps({"id": f"r{i}", "text": t}) + "\n" for i, t in enumerate(texts)))
    out = tmp_path / "cli.jsonl"
    assert score_file(["--model-repository", str(text_repository), "--model", TEXT_MODEL, "--input", str(source),
                       "--output", str(out), "--n-samples", "4", "--seed", "7", "--chunk", "3", "--threads",
                       "1"]) == 0
    scorer = Scorer(text_repository, TEXT_MODEL, n_samples=4, seed=7,
                    settings=settings_for(text_repository, tmp_path))
    frame = dd.from_pandas(pd.DataFrame({"key": [f"r{i}" for i in range(6)], "text": texts}), npartitions=2)
    meta = pd.DataFrame({name: pd.Series(dtype=object) for name in scorer.columns})
    scored = frame.map_partitions(scorer, meta=meta).compute(scheduler="threads")
    lines = [{k: v for k, v in row.items() if v is not None} for row in scored.to_dict("records")]
    assert [json.dumps(line) for line in lines] == out.read_text().splitlines()


def test_segments_hold_every_input_once_in_whole_chunks(tmp_path: Path) -> None:
    """What Ray's read tasks read: the inputs still to score, in the in-process scorer's chunks, from every kind of
    source (CSV rows over several lines and blank ones, JSONL blank lines, Parquet row groups, a folder)."""
    jsonl = tmp_path / "in.jsonl"
    jsonl.write_text("".join(("\n" if i % 4 == 0 else "") + json.dumps({"text": f"t{i}"}) + "\n" for i in range(23)))
    table = tmp_path / "in.csv"
    table.write_text("id,text\n" + "".join(f'k{i},"line one\nline {i}"\n' + ("\n" if i % 5 == 0 else "")
                                           for i in range(23)))
    parquet = tmp_path / "in.parquet"
    pq.write_table(pa.table({"text": [f"t{i}" for i in range(23)]}), parquet, row_group_size=4)
    folder = tmp_path / "images"
    folder.mkdir()
    for i in range(23):
        (folder / f"{i:02d}.png").write_bytes(b"")
    for source in (Source(jsonl), Source(table, id_column="id"), Source(parquet), Source(folder)):
        items = [(key, getattr(item, "text", None)) for key, item in read_inputs(source)]
        done = {items[0][0], items[7][0], items[8][0]}
        todo = [item for item in items if item[0] not in done]
        plan = survey(source, done, chunk=3, workers=1)
        assert plan.inputs == 23 and plan.todo == 20 and len(plan.segments) > 1, source
        chunks = [[(key, getattr(item, "text", None)) for key, item in part]
                  for segment in plan.segments for part in segment_chunks(source, segment, 3)]
        assert chunks == [todo[i:i + 3] for i in range(0, len(todo), 3)], source
