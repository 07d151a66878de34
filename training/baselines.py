"""Baselines on the pipeline's own backbone (deterministic, MC dropout, deep ensemble) and their artifacts.

Ensemble members are ordinary backbone fits with another seed, cached as checkpoints under
``<run_dir>/baselines/ensemble-seed<k>/`` (member 0 is the pipeline's backbone), so an interrupted
evaluation resumes and a rerun trains nothing.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from dataclasses import dataclass
from pathlib import Path

import torch

from models.artifact_format import ARTIFACT, FORMAT_VERSION
from models.backbones import ImageClassifier
from models.baselines import DeterministicModel, EnsembleModel, MCDropoutModel
from training.artifact import git_commit, install_version, script_and_verify, staging_dir, write_manifest
from training.config import PipelineConfig, config_dict
from training.data import load_dataset
from training.fit_backbone import BACKBONE_FILE, fit_backbone, load_backbone
from training.runtime import set_threads
from training.served_statistics import served_statistics

BASELINES = ("deterministic", "mc_dropout", "ensemble")


def member_config(cfg: PipelineConfig, seed: int) -> PipelineConfig:
    """The config of ensemble member ``seed``: the same recipe, another seed and run folder."""
    if seed == cfg.seed:
        return cfg
    return dataclasses.replace(cfg, seed=seed, run_dir=str(Path(cfg.run_dir) / "baselines" / f"ensemble-seed{seed}"))


def ensemble_members(cfg: PipelineConfig, count: int, train_missing: bool = True) -> list[ImageClassifier]:
    """``count`` independently seeded backbones (seeds cfg.seed, cfg.seed + 1, ...), fitting missing ones."""
    members = []
    for seed in range(cfg.seed, cfg.seed + count):
        member_cfg = member_config(cfg, seed)
        if not (Path(member_cfg.run_dir) / BACKBONE_FILE).exists():
            if not train_missing:
                raise FileNotFoundError(f"ensemble member seed {seed} is not trained ({member_cfg.run_dir})")
            print(f"fitting ensemble member seed {seed} into {member_cfg.run_dir}")
            fit_backbone(member_cfg)
        members.append(load_backbone(member_cfg.run_dir))
    return members


@dataclass
class BaselineModel:
    module: torch.nn.Module  # artifact contract: forward(pixels, n_samples), sample_rows(pixels, repeats)
    default_samples: int
    max_samples: int


def build_baseline(cfg: PipelineConfig, method: str, train_missing: bool = True) -> BaselineModel:
    backbone = load_backbone(cfg.run_dir)
    if method == "deterministic":
        return BaselineModel(DeterministicModel(backbone).eval(), 1, 1)
    if method == "mc_dropout":
        samples = cfg.evaluate.samples
        return BaselineModel(MCDropoutModel(backbone).eval(), samples, max(samples, cfg.export.max_samples))
    if method == "ensemble":
        members = ensemble_members(cfg, cfg.evaluate.ensemble_members, train_missing)
        return BaselineModel(EnsembleModel(members).eval(), len(members), len(members))
    raise ValueError(f"unknown baseline {method!r}; choose from {BASELINES}")


def export_baseline(cfg: PipelineConfig, method: str, repository: str | None = None) -> Path:
    """Export a baseline as ``<repository>/<name>-<method>/<version>/``, with the same manifest sections as
    DIRECTOR (``method`` says which), so the server serves and benchmarks it side by side."""
    set_threads(cfg.threads)
    ecfg = cfg.export
    data = load_dataset(cfg.data.dataset, cfg.data.root, cfg.data.val_size, cfg.data.split_seed,
                        cfg.data.train_limit, cfg.data.test_limit)
    baseline = build_baseline(cfg, method)
    name = f"{ecfg.name}-{method.replace('_', '-')}"
    out_dir = Path(repository or ecfg.repository) / name / str(ecfg.version)
    tmp_dir = staging_dir(out_dir)
    served = script_and_verify(baseline.module, baseline.module, data.val.images[:8], tmp_dir / ARTIFACT,
                               n_samples=baseline.default_samples)
    counts = [s for s in ecfg.sample_counts if s <= baseline.max_samples] or [baseline.default_samples]
    if baseline.default_samples not in counts:
        counts.append(baseline.default_samples)
    stats = served_statistics(served, data, ecfg, sorted(counts), baseline.default_samples, cfg.seed)
    image_shape = [int(s) for s in data.val.images.shape[1:]]
    manifest = {
        "format_version": FORMAT_VERSION,
        "name": name,
        "version": str(ecfg.version),
        "method": method,
        "modality": "image",
        "labels": list(data.labels),
        "input": {"channels": image_shape[0], "height": image_shape[1], "width": image_shape[2],
                  "dtype": "float32", "range": [0.0, 1.0], "layout": "NCHW",
                  "convert": {"color": "L" if image_shape[0] == 1 else "RGB",
                              "resize": "bilinear to height x width, aspect ratio not kept"}},
        "sampling": {"steps": 0, "default_samples": baseline.default_samples, "max_samples": baseline.max_samples},
        "temperature": 1.0,
        "ood": stats.ood,
        "reference": stats.reference,
        "artifact": {"file": ARTIFACT, "format": "torchscript", "torch": torch.__version__,
                     "parameters": sum(p.numel() for p in baseline.module.parameters())},
        "provenance": {"baseline_of": ecfg.name, "backbone": config_dict(cfg)["backbone"], "dataset": cfg.data.dataset,
                       "config": cfg.source, "seed": cfg.seed, "git_commit": git_commit(),
                       "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")},
    }
    write_manifest(tmp_dir, manifest)
    install_version(tmp_dir, out_dir)
    print(f"exported {method} baseline to {out_dir}")
    return out_dir
