"""Shared fixtures: tiny configs so the real pipeline runs in seconds on 2 CPU cores."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest
import torch
import yaml

warnings.filterwarnings("ignore", message=".*torch.jit.*", category=FutureWarning)
torch.set_num_threads(1)

# the Debian package's folder; a GPU host without it points DIRECTOR_FASHION_ROOT at a copy (benchmarks/gpu_check.sh)
FASHION_ROOT = Path(os.environ.get("DIRECTOR_FASHION_ROOT", "/usr/share/datasets/fashion-mnist"))


def tiny_config_dict(tmp_path: Path) -> dict:
    return {
        "name": "tiny",
        "seed": 0,
        "run_dir": str(tmp_path / "run"),
        "threads": 1,
        "data": {"root": str(FASHION_ROOT), "val_size": 300, "train_limit": 768, "test_limit": 300},
        "backbone": {"stem_channels": [8, 16, 16], "embed_dim": 32, "depth": 2, "num_heads": 2, "mlp_ratio": 2.0},
        "fit": {"epochs": 2, "batch_size": 64, "lr": 0.003, "warmup_epochs": 0.2},
        "distil": {"epochs": 2, "batch_size": 64, "warmup_steps": 2, "tau_images": 100, "stats_batches": 2,
                   "val_images": 100, "val_samples": 4},
        # the DIRECTOR path whatever the verdict: these tests read its artifact (tests/training/export/test_verdict.py
        # covers method auto)
        "export": {"name": "tiny", "method": "director", "repository": str(tmp_path / "repo"), "threshold_images": 100,
                   "ood_validation_images": 60, "sample_counts": [1, 2, 4], "default_samples": 4,
                   "max_samples": 8, "docs_dir": str(tmp_path / "docs")},
    }


def tiny_text_config_dict(tmp_path: Path) -> dict:
    """The text pipeline in seconds: a 2-layer BERT of width 32 with a WordPiece vocabulary trained on 640 movie-review
    sentences (enough to learn something in 4 short epochs), int8 word table in the artifact."""
    return {
        "name": "tiny-text",
        "seed": 0,
        "modality": "text",
        "run_dir": str(tmp_path / "run"),
        "threads": 1,
        "data": {"dataset": "movie_reviews", "val_size": 120, "train_limit": 640, "test_limit": 120},
        "text": {"backbone": "tiny", "tokenizer": "wordpiece", "vocab_size": 400, "max_length": 32,
                 "max_characters": 200, "table_dtype": "int8", "bucket": 4,
                 "tiny": {"hidden_size": 32, "num_layers": 2, "num_heads": 4, "intermediate_size": 64}},
        "fit": {"epochs": 4, "batch_size": 32, "lr": 0.002, "weight_decay": 0.01, "warmup_epochs": 0.2,
                "grad_clip": 1.0},
        "distil": {"epochs": 2, "batch_size": 32, "warmup_steps": 2, "tau_images": 60, "stats_batches": 1,
                   "val_images": 60, "val_samples": 4},
        "export": {"name": "tiny-text", "method": "director", "repository": str(tmp_path / "repo"),
                   "threshold_images": 60,
                   "ood_validation_images": 40, "sample_counts": [1, 2, 4], "default_samples": 4,
                   "max_samples": 8, "noise_scale_grid": [0.5, 1.0],
                   "docs_dir": str(tmp_path / "docs")},
        "evaluate": {"ood_images": 60},
    }


def export_tiny(tmp: Path, raw: dict) -> tuple[Path, Path]:
    """Fit-backbone, distil and export the config ``raw`` under ``tmp``; returns (config path, artifact folder)."""
    from artifact.contract import MANIFEST
    from training.cli import main

    config = tmp / f"{raw['name']}.yaml"
    config.write_text(yaml.safe_dump(raw))
    for stage in ("fit-backbone", "distil", "export"):
        assert main([stage, "--config", str(config)]) == 0
    folder = tmp / "repo" / raw["export"]["name"] / "1"
    assert (folder / MANIFEST).is_file()
    return config, folder


def export_zero_step_kernel(tmp: Path, fit_epochs: int) -> tuple[Path, Path]:
    """The tiny image pipeline under ``export.method: auto``, its backbone fitted for ``fit_epochs`` and its kernel
    trained for zero steps (the identity mean map at the observed variance); returns (config path, version folder)."""
    raw = tiny_config_dict(tmp)
    raw["export"]["method"] = "auto"
    raw["distil"]["epochs"] = 0
    raw["fit"]["epochs"] = fit_epochs
    return export_tiny(tmp, raw)


@pytest.fixture(scope="session")
def posthoc_export(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny version that serves the post-hoc path: on a backbone fitted for 8 epochs, a kernel trained for zero
    steps loses the verdict (tests/training/export/test_verdict.py)."""
    return export_zero_step_kernel(tmp_path_factory.mktemp("posthoc"), fit_epochs=8)


@pytest.fixture
def tiny_config_path(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_config_dict(tmp_path)))
    return path
