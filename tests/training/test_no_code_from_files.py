"""No file the pipeline loads runs code: a pickle that would run a command on load is planted in each place the
pipeline reads a file it did not just write (a run folder's checkpoints, the evaluation's caches, a timm weights
file, a Hugging Face folder's ``.bin`` weights), and a checkpoint whose config names its own Python classes
(``auto_map``) is refused at plan time, never prompted for and never imported. Each test checks that the planted code
did not run (its marker file does not exist)."""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from tests.training.calibrate.tiny_checkpoints import save_text_checkpoint, texts, write_csv
from training.cli import main
from training.evaluate.logit_cache import LogitCache
from training.families.checkpoint import CheckpointError, _timm_state, inspect_checkpoint, load_classifier
from training.runtime import CheckpointRefused, load_checkpoint


class Payload:
    """Unpickling calls ``Path.touch(marker)``: the code a hostile file would run, made harmless and visible."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Callable[..., object], tuple[object, ...]]:
        return Path.touch, (self.marker,)


def plant(path: Path, marker: Path, wrap: Callable[[object], object] = lambda p: p) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as handle:
        pickle.dump(wrap(Payload(marker)), handle)
    return path


def test_the_planted_payload_does_run_when_loaded_without_weights_only(tmp_path: Path) -> None:
    """The payload is real: a plain unpickle runs it (so its absence below means the loaders refused it)."""
    marker = tmp_path / "ran"
    with plant(tmp_path / "x.pt", marker).open("rb") as handle:
        pickle.load(handle)  # noqa: S301 (the point of this test)
    assert marker.exists()


def test_a_run_folder_checkpoint_is_loaded_as_weights_only(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    path = plant(tmp_path / "runs" / "tiny" / "backbone_ckpt.pt", marker, lambda p: {"model": p})
    with pytest.raises(CheckpointRefused, match="could run code"):
        load_checkpoint(path)
    assert not marker.exists()
    torch.save({"model": {"w": torch.ones(2)}, "epoch": 3, "history": [{"loss": 0.5}], "name": "x"},
               tmp_path / "good.pt")
    assert load_checkpoint(tmp_path / "good.pt")["epoch"] == 3  # the run's own payloads still load


def test_an_evaluation_cache_and_a_timm_weights_file_are_loaded_as_weights_only(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    cache = LogitCache(tmp_path / "cache")
    plant(tmp_path / "cache" / "m__set__s1.pt", marker, lambda p: {"logits": p})
    with pytest.raises(pickle.UnpicklingError):
        cache.get("m", "set", 1, lambda: torch.zeros(1, 2, 3))
    with pytest.raises(pickle.UnpicklingError):
        _timm_state(str(plant(tmp_path / "vit.pth", marker, lambda p: {"state_dict": p})))
    assert not marker.exists()


def test_a_hugging_face_folder_with_pickled_weights_never_runs_them(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    folder = save_text_checkpoint(tmp_path / "bert", "bert")
    for weights in folder.glob("*.safetensors"):
        weights.unlink()
    plant(folder / "pytorch_model.bin", marker, lambda p: {"bert.embeddings.word_embeddings.weight": p})
    checkpoint = inspect_checkpoint(str(folder))
    with pytest.raises(Exception):  # noqa: B017, PT011 (transformers' own error for a file it refuses)
        load_classifier(checkpoint, 3)
    assert not marker.exists()


def test_a_checkpoint_that_needs_its_own_code_is_refused_at_plan_time(tmp_path: Path, capsys: pytest.CaptureFixture
                                                                      ) -> None:
    """``auto_map`` made transformers ask "Do you wish to run the custom code? [y/N]", even under --dry-run."""
    marker = tmp_path / "ran"
    folder = save_text_checkpoint(tmp_path / "custom", "bert")
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "custom_code.CustomConfig",
                          "AutoModelForSequenceClassification": "custom_code.CustomModel"}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "custom_code.py").write_text(f"from pathlib import Path\nPath({str(marker)!r}).touch()\n")
    with pytest.raises(CheckpointError, match="auto_map"):
        inspect_checkpoint(str(folder))
    data = write_csv(tmp_path / "data.csv", texts(30, seed=0))
    code = main(["calibrate", "--backbone", str(folder), "--data", str(data), "--name", "custom", "--dry-run",
                 "--run-dir", str(tmp_path / "run")])
    assert code != 0
    assert "names its own Python code" in capsys.readouterr().err
    assert not marker.exists()
