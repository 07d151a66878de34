"""Shared fixtures: tiny configs so the real pipeline runs in seconds on 2 CPU cores."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
import yaml

warnings.filterwarnings("ignore", message=".*torch.jit.*", category=FutureWarning)
torch.set_num_threads(1)

FASHION_ROOT = Path("/usr/share/datasets/fashion-mnist")


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
        "export": {"name": "tiny", "repository": str(tmp_path / "repo"), "threshold_images": 100,
                   "ood_validation_images": 60, "sample_counts": [1, 2, 4], "default_samples": 4,
                   "max_samples": 8, "eval_samples": 4, "docs_dir": str(tmp_path / "docs")},
    }


@pytest.fixture
def tiny_config_path(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_config_dict(tmp_path)))
    return path
