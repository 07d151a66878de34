"""Baselines on the pipeline's own backbone (deterministic, MC dropout, deep ensemble) and their artifacts.

Ensemble members are ordinary backbone fits with another seed, cached as checkpoints under
``<run_dir>/baselines/ensemble-seed<k>/`` (member 0 is the pipeline's backbone), so an interrupted
evaluation resumes and a rerun trains nothing.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from models.artifact_format import ARTIFACT, FORMAT_VERSION
from models.backbones import ImageClassifier
from models.baselines import DeterministicModel, EnsembleModel, MCDropoutModel
from models.bert_view import BertTransitionView
from models.text_director import TextBackbone
from training.artifact import git_commit, install_version, script_and_verify, staging_dir, write_manifest
from training.config import PipelineConfig
from training.export_parts import ExportParts, image_export_parts, text_export_parts, verify_text_artifact
from training.fit_backbone import BACKBONE_FILE, fit_backbone, load_backbone
from training.runtime import set_threads
from training.served_statistics import sample_split, served_statistics, served_temperature
from training.text_inputs import TokenSplit

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
    if cfg.is_text:
        if method != "deterministic":
            raise ValueError(f"text baselines export as artifacts for method deterministic only, not {method!r}: "
                             "transformers modules do not script, and only the plain backbone is rebuilt from plain "
                             "modules (the evaluation still measures MC dropout and ensembles on texts)")
        tcfg = cfg.text
        module = TextBackbone.from_view(BertTransitionView(backbone), tcfg.table_dtype, tcfg.max_length,
                                        tcfg.layer_dtype)
        return BaselineModel(module, 1, 1)
    if method == "deterministic":
        return BaselineModel(DeterministicModel(backbone).eval(), 1, 1)
    if method == "mc_dropout":
        samples = cfg.evaluate.samples
        return BaselineModel(MCDropoutModel(backbone).eval(), samples, max(samples, cfg.export.max_samples))
    if method == "ensemble":
        members = ensemble_members(cfg, cfg.evaluate.ensemble_members, train_missing)
        return BaselineModel(EnsembleModel(members).eval(), len(members), len(members))
    raise ValueError(f"unknown baseline {method!r}; choose from {BASELINES}")


def script_baseline(baseline: BaselineModel, parts: ExportParts, path: Path) -> torch.jit.ScriptModule:
    """Script the baseline to ``path``, load it back and check it against the eager module on validation inputs."""
    probe = parts.data.val.head(8)
    if isinstance(probe, TokenSplit):
        ids, mask = probe.rows(torch.arange(len(probe)))
        return verify_text_artifact(baseline.module, ids, mask, path, n_samples=baseline.default_samples)
    return script_and_verify(baseline.module, baseline.module, probe.images, path, n_samples=baseline.default_samples)


def export_baseline(cfg: PipelineConfig, method: str, repository: str | None = None) -> Path:
    """Export a baseline as ``<repository>/<name>-<method>/<version>/``, with the same manifest sections as
    DIRECTOR (``method`` says which), so the server serves and benchmarks it side by side. Like DIRECTOR it is served
    with a temperature when that wins on held-out validation (the backbone + temperature scaling a user would
    otherwise deploy)."""
    set_threads(cfg.threads)
    ecfg = cfg.export
    backbone = load_backbone(cfg.run_dir)
    parts = text_export_parts(cfg, backbone) if cfg.is_text else image_export_parts(cfg, backbone)
    data = parts.data
    baseline = build_baseline(cfg, method)
    name = f"{ecfg.name}-{method.replace('_', '-')}"
    out_dir = Path(repository or ecfg.repository) / name / str(ecfg.version)
    tmp_dir = staging_dir(out_dir)
    served = script_baseline(baseline, parts, tmp_dir / ARTIFACT)
    for file_name, source in parts.files.items():
        shutil.copyfile(source, tmp_dir / file_name)
    counts = [s for s in ecfg.sample_counts if s <= baseline.max_samples] or [baseline.default_samples]
    if baseline.default_samples not in counts:
        counts.append(baseline.default_samples)
    temperature, temperature_fit = 1.0, {}
    if ecfg.temperature_scaling:
        val_logits = sample_split(served, data.val, baseline.default_samples, cfg.seed + 2)  # [S, N, C]
        temperature, temperature_fit = served_temperature(val_logits, data.val.labels)
    stats = served_statistics(served, data, ecfg, sorted(counts), baseline.default_samples, cfg.seed,
                              parts.ood_validation, parts.selection_set, temperature)
    manifest = {
        "format_version": FORMAT_VERSION,
        "name": name,
        "version": str(ecfg.version),
        "method": method,
        "modality": cfg.modality,
        "labels": list(data.labels),
        "input": parts.input_section,
        "sampling": {"steps": 0, "default_samples": baseline.default_samples, "max_samples": baseline.max_samples},
        "temperature": temperature,
        "ood": stats.ood,
        "reference": stats.reference,
        "artifact": {"file": ARTIFACT, "format": "torchscript", "torch": torch.__version__, **parts.signatures,
                     "parameters": sum(p.numel() for p in baseline.module.parameters())},
        "provenance": {"baseline_of": ecfg.name, "backbone": parts.backbone_description, "dataset": cfg.data.dataset,
                       "config": cfg.source, "seed": cfg.seed, "git_commit": git_commit(),
                       "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                       "temperature_fit": temperature_fit},
    }
    write_manifest(tmp_dir, manifest)
    install_version(tmp_dir, out_dir)
    print(f"exported {method} baseline to {out_dir} (temperature {temperature:.3f})")
    return out_dir
