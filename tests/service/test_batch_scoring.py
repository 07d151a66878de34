"""Offline batch scoring (``service.batch_scoring``): the server's own answers for an image folder, a JSONL file and
a CSV file, written as JSONL, resumed after a crash, one bad input (or line of bytes) costing only its own line, and
the input never overwritten."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image

from service.batch_scoring import main
from tests.service.conftest import TEXT_MODEL, serve, settings_for


def png(seed: int) -> bytes:
    pixels = (np.random.default_rng(seed).random((28, 28)) * 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels, mode="L").save(out, format="PNG")
    return out.getvalue()


def lines(path: Path) -> dict[str, dict]:
    return {row["key"]: row for row in map(json.loads, path.read_text().splitlines())}


def test_an_image_folder_scores_as_predict_answers_and_resumes(tiny_repository: Path, tmp_path: Path) -> None:
    folder = tmp_path / "images"
    (folder / "sub").mkdir(parents=True)
    for name, seed in (("a.png", 0), ("sub/b.png", 1), ("c.png", 2)):
        (folder / name).write_bytes(png(seed))
    (folder / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\nnot an image")
    (folder / "notes.txt").write_text("not an input")
    out = tmp_path / "scores.jsonl"
    args = ["--model-repository", str(tiny_repository), "--model", "tiny", "--input", str(folder), "--output",
            str(out), "--n-samples", "4", "--seed", "7", "--chunk", "2", "--threads", "1"]
    assert main(args) == 0
    scored = lines(out)
    assert set(scored) == {"a.png", "sub/b.png", "c.png", "broken.png"}
    assert scored["broken.png"]["status"] == 400 and "error" in scored["broken.png"]
    # the server gives the same answer for the same seeded request
    with serve(settings_for(tiny_repository, tmp_path)) as running:
        body = {"model": "tiny", "n_samples": 4, "seed": 7,
                "inputs": [{"image_base64": base64.b64encode((folder / n).read_bytes()).decode()}
                           for n in ("a.png", "broken.png")][:1]}
        served = httpx.post(f"{running.url}/predict", json=body, timeout=60).json()["predictions"][0]
    row = scored["a.png"]
    assert row["label"] == served["label"] and row["ood_score"] == served["ood_score"]
    assert row["probabilities"] == served["probabilities"] and row["model_version"] == "1"
    assert row["ood_score_name"] and isinstance(row["ood_threshold"], float)
    # a crash cut the last line short: it is dropped, that input scored again, nothing else
    text = out.read_text().splitlines()
    out.write_text("\n".join(text[:-1]) + "\n" + text[-1][:20])
    assert main(args) == 0
    again = out.read_text().splitlines()
    assert len(again) == 4 and lines(out).keys() == scored.keys()


def test_jsonl_and_csv_texts(text_repository: Path, tmp_path: Path) -> None:
    jsonl = tmp_path / "texts.jsonl"
    jsonl.write_text('{"id": "r1", "text": "a warm and funny film."}\n\n{"text": "dull."}\n{"pixels": 3}\n'
                     '{"text": ""}\n')
    out = tmp_path / "jsonl.out"
    assert main(["--model-repository", str(text_repository), "--model", TEXT_MODEL, "--input", str(jsonl),
                 "--output", str(out)]) == 0
    scored = lines(out)
    assert set(scored) == {"r1", "3", "4", "5"}  # the id, else the line number
    assert scored["r1"]["tokens"] > 0 and "truncated" in scored["r1"]
    assert scored["4"]["status"] == 422 and scored["5"]["status"] == 422  # not an input; an empty text
    table = tmp_path / "texts.csv"
    table.write_text("review_id,review\nx,a gripping film\ny,boring\n")
    out_csv = tmp_path / "csv.out"
    assert main(["--model-repository", str(text_repository), "--model", TEXT_MODEL, "--input", str(table),
                 "--output", str(out_csv), "--text-column", "review", "--id-column", "review_id"]) == 0
    assert set(lines(out_csv)) == {"x", "y"}


def test_a_wrong_model_fails_the_run_not_every_input(tiny_repository: Path, tmp_path: Path) -> None:
    jsonl = tmp_path / "in.jsonl"
    jsonl.write_text('{"pixels": [[0.0]]}\n')
    out = tmp_path / "out.jsonl"
    assert main(["--model-repository", str(tiny_repository), "--model", "nope", "--input", str(jsonl),
                 "--output", str(out)]) == 2
    assert not out.exists() or out.read_text() == ""


def test_a_bad_line_is_its_own_error_and_the_run_goes_on(tiny_repository: Path, tmp_path: Path) -> None:
    """A line of invalid UTF-8 or one nested 100,000 deep gave a traceback, exit 1 and no line written."""
    jsonl = tmp_path / "in.jsonl"
    good = json.dumps({"id": "good", "pixels": [[0.5] * 28] * 28})
    jsonl.write_bytes(good.encode() + b"\n" + b'{"pixels": "\xff\xfe"}\n' + b"[" * 100_000 + b"\n" + good.encode()
                      .replace(b'"good"', b'"also good"') + b"\n")
    out = tmp_path / "out.jsonl"
    assert main(["--model-repository", str(tiny_repository), "--model", "tiny", "--input", str(jsonl),
                 "--output", str(out)]) == 0
    scored = lines(out)
    assert set(scored) == {"good", "2", "3", "also good"}
    assert scored["2"]["status"] == 400 and "not UTF-8" in scored["2"]["error"]
    assert scored["3"]["status"] == 422 and "nested too deeply" in scored["3"]["error"]
    assert "label" in scored["good"] and "label" in scored["also good"]
    assert not (tmp_path / "out.jsonl.partial").exists()


def test_a_csv_row_that_is_not_utf8_is_its_own_error(text_repository: Path, tmp_path: Path) -> None:
    table = tmp_path / "texts.csv"
    table.write_bytes(b"review\na gripping film\nbad \xff bytes\nboring\n")
    out = tmp_path / "out.jsonl"
    assert main(["--model-repository", str(text_repository), "--model", TEXT_MODEL, "--input", str(table),
                 "--output", str(out), "--text-column", "review"]) == 0
    scored = lines(out)
    assert set(scored) == {"1", "2", "3"} and scored["2"]["status"] == 400 and "label" in scored["3"]


def test_the_output_may_not_be_the_input_nor_a_link_to_it(tiny_repository: Path, tmp_path: Path) -> None:
    """``--output`` naming the input emptied it and exited 0."""
    jsonl = tmp_path / "in.jsonl"
    content = json.dumps({"pixels": [[0.5] * 28] * 28}) + "\n"
    jsonl.write_text(content)
    link = tmp_path / "link.jsonl"
    link.symlink_to(jsonl)
    for output in (jsonl, link):
        with pytest.raises(SystemExit) as exit_:
            main(["--model-repository", str(tiny_repository), "--model", "tiny", "--input", str(jsonl),
                  "--output", str(output)])
        assert exit_.value.code == 2
        assert jsonl.read_text() == content


def test_a_crashed_run_leaves_the_finished_output_whole(tiny_repository: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The lines go to OUTPUT.partial, renamed into place at the end: a run that dies midway leaves the earlier output
    as it was, and the next run resumes from the partial file."""
    import service.batch_scoring as batch_scoring

    jsonl = tmp_path / "in.jsonl"
    jsonl.write_text("".join(json.dumps({"id": f"k{i}", "pixels": [[i / 10] * 28] * 28}) + "\n" for i in range(4)))
    out = tmp_path / "out.jsonl"
    args = ["--model-repository", str(tiny_repository), "--model", "tiny", "--input", str(jsonl), "--output",
            str(out), "--chunk", "2"]
    out.write_text(json.dumps({"key": "k0", "label": "kept"}) + "\n")  # a finished earlier run scored k0
    before = out.read_text()
    real, calls = batch_scoring.score_chunk, []

    async def dies_on_the_second_chunk(*a: object) -> list[dict]:
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("killed")
        return await real(*a)

    monkeypatch.setattr(batch_scoring, "score_chunk", dies_on_the_second_chunk)
    with pytest.raises(RuntimeError, match="killed"):
        main(args)
    assert out.read_text() == before  # untouched
    assert set(lines(tmp_path / "out.jsonl.partial")) == {"k0", "k1", "k2"}
    monkeypatch.setattr(batch_scoring, "score_chunk", real)
    assert main(args) == 0
    scored = lines(out)
    assert set(scored) == {"k0", "k1", "k2", "k3"} and scored["k0"]["label"] == "kept"
