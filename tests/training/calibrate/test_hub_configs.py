"""The hub-backed calibrate configs a user with internet starts from (``configs/calibrate/``), checked with
``--dry-run``. The hub cannot be reached here, so each runs on a local stand-in: a ``config.json`` of the same
architecture and shape as the hub checkpoint (a dry run reads the configuration only, never weights)."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import pytest
from transformers import Qwen2Config, ViTConfig

from training.cli import main

CONFIGS = Path(__file__).resolve().parents[3] / "configs" / "calibrate"


class Done(NamedTuple):
    returncode: int
    stdout: str
    stderr: str


def dry_run(config: str, backbone: Path, tmp_path: Path, capsys: pytest.CaptureFixture, *extra: str) -> Done:
    status = main(["calibrate", "--config", str(CONFIGS / config), "--backbone", str(backbone), "--name", "hub",
                   "--run-dir", str(tmp_path / "run"), "--repository", str(tmp_path / "repo"), "--dry-run", *extra])
    out = capsys.readouterr()
    return Done(status, out.out, out.err)


def test_qwen_on_cola_diffuses_the_last_five_of_its_24_layers(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    Qwen2Config(  # Qwen/Qwen2.5-0.5B's shape
        vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
        num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1_000_000.0, tie_word_embeddings=True,
        architectures=["Qwen2ForCausalLM"]).save_pretrained(tmp_path / "qwen")
    done = dry_run("qwen2.5-0.5b-cola.yaml", tmp_path / "qwen", tmp_path, capsys)
    assert done.returncode == 0, done.stdout + done.stderr
    for expected in ("family            decoder (text), 24 layers, 494.0M parameters", "K in [5]",
                     "64 tokens (at most)", "built-in dataset 'cola'"):
        assert expected in done.stdout, (expected, done.stdout)


@pytest.mark.parametrize("config", ["vit-b16-cifar10.yaml", "vit-b16-cifar100.yaml"])
def test_vit_b16_on_cifar_plans_224_pixel_inputs(config: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    ViTConfig(architectures=["ViTModel"]).save_pretrained(tmp_path / "vit")  # ViT-B/16 at 224 pixels
    done = dry_run(config, tmp_path / "vit", tmp_path, capsys, "--set", "data.train_limit=1000", "--set",
                   "data.test_limit=500", "--set", "data.val_size=500")
    assert done.returncode == 0, done.stdout + done.stderr
    for expected in ("family            vit (image), 12 layers", "K in [1, 2, 3]", "197 patches"):
        assert expected in done.stdout, (expected, done.stdout)


def test_a_run_this_machine_cannot_hold_is_refused_with_what_to_change(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture) -> None:
    """All 45,000 CIFAR-10 training images at 224 x 224 in float32 (and the validation and test images: 33 GB in all)
    are more than this project's 24 GB machines hold; the start states would go to disk."""
    ViTConfig(architectures=["ViTModel"]).save_pretrained(tmp_path / "vit")
    done = dry_run("vit-b16-cifar10.yaml", tmp_path / "vit", tmp_path, capsys, "--set", "data.train_limit=45000")
    assert done.returncode == 2
    assert "will not fit: memory" in done.stdout and "data.train_limit" in done.stdout
