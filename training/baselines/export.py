"""Stage ``export-baseline``: a baseline (``training.baselines.builders``) exported under the same artifact contract and
manifest sections as DIRECTOR, so the server serves and benchmarks it side by side."""

from __future__ import annotations

import copy
import datetime as dt
import shutil
from pathlib import Path

import torch

from artifact.contract import ARTIFACT, FORMAT_VERSION, Manifest, Provenance, Sampling, file_digests
from models.backbones import fold_batch_norms
from training.baselines.builders import BaselineModel, build_baseline
from training.config import PipelineConfig
from training.loading import RunBackbone
from training.posthoc.modality_parts import (
    ExportParts,
    artifact_info,
    export_parts,
)
from training.posthoc.served_statistics import sample_split, served_statistics, served_temperature
from training.posthoc.writing import git_commit, install_version, script_and_verify, staging_dir, write_manifest
from training.runtime import set_threads


def script_baseline(baseline: BaselineModel, parts: ExportParts, path: Path) -> torch.jit.ScriptModule:
    """Script the baseline to ``path`` (a conv stem's batch norms folded into its convolutions, as DIRECTOR's
    artifact has them), load it back and check it against the eager module, unfolded, on validation inputs."""
    eager = copy.deepcopy(baseline.module)
    fold_batch_norms(baseline.module)
    return script_and_verify(baseline.module, eager, parts.data.val.first_args(8), path,
                             n_samples=baseline.default_samples)


def export_baseline(cfg: PipelineConfig, method: str, repository: str | None = None) -> Path:
    """Export a baseline as ``<repository>/<name>-<method>/<version>/``, with the same manifest sections as
    DIRECTOR (``method`` says which), so the server serves and benchmarks it side by side. Like DIRECTOR it is served
    with a temperature when that wins on held-out validation (the backbone + temperature scaling a user would
    otherwise deploy)."""
    if cfg.modality == "text" and method != "deterministic":
        raise ValueError(f"text baselines export as artifacts for method deterministic only, not {method!r}: "
                         "transformers modules do not script, and only the plain backbone is rebuilt from plain "
                         "modules (the evaluation still measures MC dropout, ensembles and KEP-SVGP on texts)")
    set_threads(cfg.threads)
    ecfg = cfg.export
    opened = RunBackbone.open(cfg.run_dir)  # backbone.pt read once
    backbone = opened.backbone
    parts = export_parts(cfg, opened.family, backbone)
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
    stats = served_statistics(served, data.val, ecfg, sorted(counts), baseline.default_samples, cfg.seed,
                              parts.ood_families, temperature)
    manifest = Manifest(
        format_version=FORMAT_VERSION, name=name, version=str(ecfg.version), method=method, modality=cfg.modality,
        labels=list(data.labels), input=parts.input_section,
        sampling=Sampling(depth=0, default_samples=baseline.default_samples, max_samples=baseline.max_samples),
        temperature=temperature, ood=stats.ood, reference=stats.reference,
        artifact=artifact_info(parts, baseline.module),
        provenance=Provenance(baseline_of=ecfg.name, backbone=parts.backbone_description, dataset=cfg.data.dataset,
                              config=cfg.source, seed=cfg.seed, git_commit=git_commit(),
                              date=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                              temperature_fit=temperature_fit),
        files=file_digests(tmp_dir))
    write_manifest(tmp_dir, manifest)
    install_version(tmp_dir, out_dir)
    print(f"exported {method} baseline to {out_dir} (temperature {temperature:.3f})")
    return out_dir
