"""Shared fixtures: tiny configs so the real pipeline runs in seconds on 2 CPU cores."""

from __future__ import annotations

import os
import shutil
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
        # covers method auto, at the default verdict_bootstrap; here the verdict is only recorded, its intervals from
        # 50 resamples, which keeps the export's bootstrap from dominating its time)
        "export": {"name": "tiny", "method": "director", "repository": str(tmp_path / "repo"), "threshold_images": 100,
                   "ood_validation_images": 60, "sample_counts": [1, 2, 4], "default_samples": 4,
                   "max_samples": 8, "docs_dir": str(tmp_path / "docs"), "verdict_bootstrap": 50},
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
                   "docs_dir": str(tmp_path / "docs"), "verdict_bootstrap": 50},  # as tiny_config_dict's
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


def copy_export(exported: tuple[Path, Path], tmp: Path) -> tuple[Path, Path]:
    """A private copy under ``tmp`` of a tiny run exported by ``export_tiny`` (its run folder, repository and docs),
    its config pointed at the copy: for a test that writes into the run or its version folder, so the shared run
    (``tiny_export``, ``tiny_text_export``) stays as exported. Returns (config path, version folder)."""
    config, folder = exported
    source = config.parent
    raw = yaml.safe_load(config.read_text())
    for name in ("run", "repo", "docs"):
        if (source / name).exists():
            shutil.copytree(source / name, tmp / name, symlinks=True)
    raw["run_dir"] = str(tmp / "run")
    raw["export"]["repository"], raw["export"]["docs_dir"] = str(tmp / "repo"), str(tmp / "docs")
    copied = tmp / config.name
    copied.write_text(yaml.safe_dump(raw))
    return copied, tmp / folder.relative_to(source)


def export_zero_step_kernel(tmp: Path, fit_epochs: int, fitted: Path | None = None, method: str = "auto"
                            ) -> tuple[Path, Path]:
    """The tiny image pipeline under ``export.method`` (auto by default), its backbone fitted for ``fit_epochs`` and
    its kernel trained for zero steps (the identity mean map at the observed variance); returns (config path, version
    folder). ``fitted``: the run folder of a tiny run whose backbone was fitted on the same settings for
    ``fit_epochs``, whose fit checkpoint this run resumes from (so the fit is not repeated)."""
    raw = tiny_config_dict(tmp)
    raw["export"]["method"] = method
    del raw["export"]["verdict_bootstrap"]  # the verdict decides here: its intervals at the default resamples
    raw["distil"]["epochs"] = 0
    raw["fit"]["epochs"] = fit_epochs
    if fitted is not None:
        (tmp / "run").mkdir(parents=True)
        shutil.copy(fitted / "backbone_ckpt.pt", tmp / "run" / "backbone_ckpt.pt")
    return export_tiny(tmp, raw)


@pytest.fixture(scope="session")
def tiny_export(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The tiny image pipeline run once for the session (fit-backbone, distil, export; about 15 s): (config path,
    version folder ``<tmp>/repo/tiny/1``). Shared: tests only read it; one that writes works on ``copy_export``."""
    tmp = tmp_path_factory.mktemp("tiny-pipeline")
    return export_tiny(tmp, tiny_config_dict(tmp))


@pytest.fixture(scope="session")
def tiny_text_export(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The tiny text pipeline run once for the session (about 30 s), shared as ``tiny_export`` is."""
    tmp = tmp_path_factory.mktemp("tiny-text-pipeline")
    return export_tiny(tmp, tiny_text_config_dict(tmp))


@pytest.fixture(scope="session")
def posthoc_export(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny version that serves the post-hoc path, as ``export.method: posthoc`` asks: on a backbone fitted for 8
    epochs, a kernel trained for zero steps (under ``auto`` its error earns the hybrid its place there:
    tests/training/export/test_verdict.py)."""
    return export_zero_step_kernel(tmp_path_factory.mktemp("posthoc"), fit_epochs=8, method="posthoc")


@pytest.fixture(scope="session")
def hybrid_export(tmp_path_factory: pytest.TempPathFactory, posthoc_export: tuple[Path, Path]) -> tuple[Path, Path]:
    """The same run under ``export.method: auto``: DIRECTOR's sampled logits lose to the backbone's, and the zero-step
    kernel's error (how far the skipped layer moves each input) earns the hybrid its place over the post-hoc path."""
    fitted = Path(posthoc_export[0]).parent / "run"
    return export_zero_step_kernel(tmp_path_factory.mktemp("hybrid"), fit_epochs=8, fitted=fitted)


@pytest.fixture
def tiny_config_path(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_config_dict(tmp_path)))
    return path
