"""Offline scoring on Ray Data (``--engine ray``) on a Ray of two CPUs bound to loopback, one for the module: the
in-process scorer's lines, byte for byte (texts from JSONL, a CSV, images from a folder, Parquet in and out), with two
actors; a run stopped midway resumes with nothing lost or written twice; the CPUs a run takes are given back."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from service.batch_scoring import main
from service.scoring.ray_data import start_local_ray
from tests.service.conftest import TEXT_MODEL, wait_for

CPUS = 2.0


@pytest.fixture(scope="module")
def ray_session() -> Iterator[ModuleType]:
    start_local_ray(num_cpus=int(CPUS))
    import ray

    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.fixture
def ray_cpus(ray_session: ModuleType) -> Iterator[ModuleType]:
    """The Ray session; after the test, every CPU its actors took is free again."""
    assert ray_session.available_resources().get("CPU") == CPUS
    yield ray_session
    wait_for(lambda: ray_session.available_resources().get("CPU") == CPUS, "the Ray actors' CPUs", timeout_s=60)


def both(repository: Path, model: str, source: Path, tmp_path: Path, name: str, *flags: str) -> tuple[Path, Path]:
    """The source scored in this process and on Ray with two actors, into ``name`` (its suffix says the format)."""
    common = ["--model-repository", str(repository), "--model", model, "--input", str(source), "--n-samples", "4",
              "--seed", "7", "--chunk", "3", "--threads", "1", *flags]
    local, on_ray = tmp_path / f"local-{name}", tmp_path / f"ray-{name}"
    assert main([*common, "--output", str(local)]) == 0
    assert main([*common, "--output", str(on_ray), "--engine", "ray", "--actors", "2"]) == 0
    return local, on_ray


def test_texts_on_ray_are_the_in_process_lines(ray_cpus: ModuleType, text_repository: Path, tmp_path: Path) -> None:
    source = tmp_path / "texts.jsonl"
    texts = [f"a {word} film." for word in ("warm", "dull", "long", "sad", "bright", "odd", "grim")]
    rows = [json.dumps({"id": f"r{i}", "text": t}) for i, t in enumerate(texts)]
    source.write_text("\n".join([*rows[:2], "", rows[2], '{"text": ""}', "not json", *rows[3:]]) + "\n")
    local, on_ray = both(text_repository, TEXT_MODEL, source, tmp_path, "texts.jsonl")
    assert on_ray.read_bytes() == local.read_bytes()
    lines = [json.loads(line) for line in on_ray.read_text().splitlines()]
    assert [line["key"] for line in lines] == ["r0", "r1", "r2", "5", "6", "r3", "r4", "r5", "r6"]
    assert lines[3]["status"] == 422 and lines[4]["status"] == 422 and "label" in lines[8]
    table = tmp_path / "texts.csv"
    table.write_text("review\n" + "\n".join(f'"{t}"' for t in texts) + "\n")
    local, on_ray = both(text_repository, TEXT_MODEL, table, tmp_path, "csv.jsonl", "--text-column", "review")
    assert on_ray.read_bytes() == local.read_bytes() and len(local.read_text().splitlines()) == len(texts)


def png(seed: int) -> bytes:
    pixels = (np.random.default_rng(seed).random((28, 28)) * 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels, mode="L").save(out, format="PNG")
    return out.getvalue()


def test_images_and_parquet_on_ray_are_the_in_process_lines(ray_cpus: ModuleType, text_repository: Path,
                                                             tmp_path: Path) -> None:
    folder = tmp_path / "images"
    (folder / "sub").mkdir(parents=True)
    for i in range(7):
        (folder / ("sub" if i % 2 else "") / f"{i}.png").write_bytes(png(i))
    (folder / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\nnot an image")
    local, on_ray = both(text_repository, "tiny", folder, tmp_path, "images.jsonl")
    assert on_ray.read_bytes() == local.read_bytes()
    assert len(local.read_text().splitlines()) == 8 and '"status": 400' in local.read_text()
    source = tmp_path / "texts.parquet"
    pq.write_table(pa.table({"id": [f"t{i}" for i in range(5)], "body": ["good", "bad", None, "fine", "odd"]}),
                   source, row_group_size=2)
    local, on_ray = both(text_repository, TEXT_MODEL, source, tmp_path, "texts.parquet", "--text-column", "body",
                         "--id-column", "id")
    assert pq.read_table(on_ray).to_pylist() == pq.read_table(local).to_pylist()
    rows = pq.read_table(on_ray).to_pylist()
    assert [row["key"] for row in rows] == [f"t{i}" for i in range(5)] and rows[2]["status"] == 422
    assert set(rows[0]["probabilities"]) and not (tmp_path / "ray-texts.parquet.partial").exists()
    refused = tmp_path / "refused.jsonl"  # a sample count the version cannot take: one line, before any actor starts
    assert main(["--model-repository", str(text_repository), "--model", "tiny", "--input", str(folder), "--output",
                 str(refused), "--n-samples", "100000", "--engine", "ray"]) == 2
    assert not refused.exists()


def test_a_stopped_ray_run_resumes_with_nothing_lost_or_twice(ray_cpus: ModuleType, text_repository: Path,
                                                              tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import service.scoring.outputs as outputs

    source = tmp_path / "texts.jsonl"
    source.write_text("".join(json.dumps({"text": f"review number {i}, a fine film."}) + "\n" for i in range(40)))
    out = tmp_path / "scores.jsonl"
    args = ["--model-repository", str(text_repository), "--model", TEXT_MODEL, "--input", str(source), "--output",
            str(out), "--chunk", "4", "--engine", "ray", "--actors", "2"]
    real, writes = outputs.JsonlSink.write, []

    def stops_at_the_fourth_chunk(sink: outputs.JsonlSink, lines: list[dict]) -> None:
        writes.append(len(lines))
        if len(writes) == 4:
            raise KeyboardInterrupt  # the run stopped by hand
        real(sink, lines)

    monkeypatch.setattr(outputs.JsonlSink, "write", stops_at_the_fourth_chunk)
    with pytest.raises(KeyboardInterrupt):
        main(args)
    partial = tmp_path / "scores.jsonl.partial"
    assert not out.exists() and len(partial.read_text().splitlines()) == 12
    wait_for(lambda: ray_cpus.available_resources().get("CPU") == CPUS, "the stopped run's CPUs", timeout_s=60)
    monkeypatch.setattr(outputs.JsonlSink, "write", real)
    assert main(args) == 0
    keys = [json.loads(line)["key"] for line in out.read_text().splitlines()]
    assert sorted(keys, key=int) == [str(i) for i in range(1, 41)] and len(keys) == 40  # all there, each once
