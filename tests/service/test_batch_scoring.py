"""Offline batch scoring (``service.batch_scoring``): the server's own answers for an image folder, a JSONL file and
a CSV file, written as JSONL, resumed after a crash, one bad input (or line of bytes) costing only its own line, and
the input never overwritten."""

from __future__ import annotations

import base64
import io
import json
import os
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image

from service.batch_scoring import main
from tests.service.conftest import TEXT_MODEL, copy_version, serve, settings_for


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

    def dies_on_the_second_chunk(*a: object) -> list[dict]:
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("killed")
        return real(*a)

    monkeypatch.setattr(batch_scoring, "score_chunk", dies_on_the_second_chunk)
    with pytest.raises(RuntimeError, match="killed"):
        main(args)
    assert out.read_text() == before  # untouched
    assert set(lines(tmp_path / "out.jsonl.partial")) == {"k0", "k1", "k2"}
    monkeypatch.setattr(batch_scoring, "score_chunk", real)
    assert main(args) == 0
    scored = lines(out)
    assert set(scored) == {"k0", "k1", "k2", "k3"} and scored["k0"]["label"] == "kept"


@pytest.fixture
def loaded(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The version folders the scorer loads, in order (each still loaded)."""
    import service.scoring.version as version

    folders: list[Path] = []
    real = version.load_artifact

    def spy(folder: Path, *args: object, **kwargs: object) -> object:
        folders.append(folder)
        return real(folder, *args, **kwargs)

    monkeypatch.setattr(version, "load_artifact", spy)
    return folders


def pixels_lines(path: Path, ids: list[str | None]) -> Path:
    path.write_text("".join(json.dumps({**({"id": key} if key is not None else {}), "pixels": [[0.5] * 28] * 28})
                            + "\n" for key in ids))
    return path


def test_an_id_that_is_another_inputs_key_is_refused_before_loading(tiny_repository: Path, tmp_path: Path,
                                                                    loaded: list[Path],
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Line 1's id "3" was also line 3's key (its number): both were scored under "3", and a resumed run skipped
    the second, exit 0. Every key names one input, or nothing is scored."""
    out = tmp_path / "out.jsonl"
    common = ["--model-repository", str(tiny_repository), "--model", "tiny", "--output", str(out)]
    for ids, key in (([None, "3", None], "3"), (["a", "b", "a"], "a"), (["7", None, "7"], "7")):
        source = pixels_lines(tmp_path / "in.jsonl", ids)
        assert main([*common, "--input", str(source)]) == 2
        error = capsys.readouterr().err.strip()
        assert f"key {key!r} names two inputs" in error and len(error.splitlines()) == 1, error
    table = tmp_path / "in.csv"
    table.write_text("id,text\nx,good\n3,fine\n,nice\n")  # row 3 has no id: its key is its number, row 2's id
    assert main([*common, "--input", str(table), "--id-column", "id"]) == 2
    assert "key '3' names two inputs" in capsys.readouterr().err
    assert not out.exists() and not (tmp_path / "out.jsonl.partial").exists() and loaded == []
    source = pixels_lines(tmp_path / "in.jsonl", [None, "x", None])  # no collision: every line scored once
    assert main([*common, "--input", str(source)]) == 0
    assert set(lines(out)) == {"1", "x", "3"} and len(out.read_text().splitlines()) == 3


def unwritable_folder(tmp_path: Path) -> Path:
    """A folder no file can be created in: a read-only one, or sysfs where permissions do not stop root."""
    folder = tmp_path / "read-only"
    folder.mkdir(mode=0o555)
    return Path("/sys") if os.geteuid() == 0 else folder


def test_a_bad_output_or_flag_is_one_line_before_any_model_loads(tiny_repository: Path, tmp_path: Path,
                                                                 loaded: list[Path],
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """An output in a missing or read-only folder and --chunk 0 gave tracebacks once the models were loaded, an
    output that is a folder failed only at the final rename, and --chunk -1 exited 0 with an empty output."""
    source = pixels_lines(tmp_path / "in.jsonl", [None, None])
    table = tmp_path / "in.csv"
    table.write_text("review\ngood\n")
    (tmp_path / "a-file").write_text("")
    (tmp_path / "a-folder").mkdir()
    (tmp_path / "taken.jsonl.partial").mkdir()
    good = ["--output", str(tmp_path / "out.jsonl")]
    cases = [(["--output", str(tmp_path / "missing" / "out.jsonl")], "does not exist"),
             (["--output", str(unwritable_folder(tmp_path) / "out.jsonl")], "cannot write"),
             (["--output", str(tmp_path / "a-folder")], "is a folder"),
             (["--output", str(tmp_path / "taken.jsonl")], "is a folder"),
             (["--output", str(tmp_path / "a-file" / "out.jsonl")], "is not a folder"),
             ([*good, "--chunk", "0"], "--chunk"), ([*good, "--chunk", "-1"], "--chunk"),
             ([*good, "--threads", "-1"], "--threads"), ([*good, "--n-samples", "0"], "--n-samples"),
             ([*good, "--seed", "-1"], "--seed"), ([*good, "--seed", str(2**63)], "--seed"),
             ([*good, "--id-column", "id"], "--id-column"),
             ([*good, "--input", str(table)], "no column 'text'"),
             ([*good, "--input", str(table), "--text-column", "review", "--id-column", "key"], "no column 'key'")]
    for flags, words in cases:
        with pytest.raises(SystemExit) as exit_:
            main(["--model-repository", str(tiny_repository), "--model", "tiny", "--input", str(source), *flags])
        error = capsys.readouterr().err
        assert exit_.value.code == 2 and "Traceback" not in error, (flags, error)
        assert words in error.strip().splitlines()[-1], (flags, error)
    assert loaded == [] and not (tmp_path / "out.jsonl").exists()


def test_only_the_model_version_it_scores_is_loaded(tiny_artifact: Path, tmp_path: Path, loaded: list[Path],
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Every model of the repository was loaded to score one (2.08 GB for two lines)."""
    repository = tmp_path / "repository"
    for name, version in (("tiny", "1"), ("tiny", "2"), ("other", "1")):
        copy_version(tiny_artifact, repository, name, version)
    (repository / "broken" / "1").mkdir(parents=True)  # no artifact at all: loading it fails
    source = pixels_lines(tmp_path / "in.jsonl", [None])
    common = ["--model-repository", str(repository), "--input", str(source), "--model", "tiny"]
    assert main([*common, "--version", "1", "--output", str(tmp_path / "one.jsonl")]) == 0
    assert loaded == [repository / "tiny" / "1"]
    assert main([*common, "--output", str(tmp_path / "highest.jsonl")]) == 0  # no version: the highest one
    assert loaded[1:] == [repository / "tiny" / "2"] and lines(tmp_path / "highest.jsonl")["1"]["model_version"] == "2"
    capsys.readouterr()
    assert main([*common, "--version", "3", "--output", str(tmp_path / "none.jsonl")]) == 2
    assert "no version '3'" in capsys.readouterr().err
    assert main([*common[:-1], "nope", "--output", str(tmp_path / "none.jsonl")]) == 2
    assert "no model 'nope'" in capsys.readouterr().err
    assert len(loaded) == 2 and not (tmp_path / "none.jsonl").exists()
