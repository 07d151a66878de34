"""Distillation variants a reviewer asks for, each a cached run beside the main one.

Every variant reuses the main run's frozen backbone and changes one thing. Variants named in
``evaluate.ablations`` train for ``evaluate.ablation_epochs`` (the ``both`` variant is the reference at the
same budget, so the comparison is fair); the extra seeds in ``evaluate.distil_seeds`` use the full recipe, so
the main model and those seeds give a mean +- std. tau is fixed to the main run's selected value except in
the tau variants.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path
from typing import Any

from training.config import DistilConfig, PipelineConfig
from training.data.tokens import TOKENIZER_FILE
from training.distil.stage import distil
from training.loading import BACKBONE_FILE, DIRECTOR_FILE
from training.runtime import load_checkpoint

# Variants that change fixed settings, each with what it measures.
FIXED_VARIANTS: dict[str, dict[str, Any]] = {
    "both": {},  # the main recipe at the ablation budget: the reference row
    "floor": {"observed_variance": "floor"},  # the floor alone as the observed variance (the authors' choice)
    "l1_only": {"lambda_1": 1.0, "lambda_2": 0.0},
    "l2_only": {"lambda_1": 0.0, "lambda_2": 1.0},
    "teacher": {"l2_target": "teacher"},  # L2 against the backbone's softmax instead of the labels
    # plus one perturbed copy of every training input (unlabeled: needs the teacher's targets)
    "unlabeled": {"l2_target": "teacher", "unlabeled_copies": 1},
    # text: the same plus the sentences of an unlabeled corpus that is none of the evaluation's sets
    "corpus": {"l2_target": "teacher", "unlabeled_copies": 1, "unlabeled_corpus": "debian_descriptions"},
    "readout": {"finetune_readout": True},  # the readout (final norm and head) trained with the kernel
    "rollout": {"l1_on_rollout": True},  # L1 on the states of a detached rollout instead of the teacher's trajectory
}


def variant_overrides(name: str, base: DistilConfig) -> dict[str, Any]:
    """The distil settings a named variant changes: one of ``FIXED_VARIANTS``, ``tau_<value>``, ``depth_<K>`` (the
    sweep over partial depth; tau is selected again for each K) or ``mlp_<ratio>`` (the kernel's width: its MLP's
    hidden size over the model width)."""
    if name in FIXED_VARIANTS:
        return FIXED_VARIANTS[name]
    if name.startswith("tau_"):
        return {"tau": float(name.removeprefix("tau_"))}
    if name.startswith("depth_"):
        return {"depth": int(name.removeprefix("depth_")), "tau": None}
    if name.startswith("mlp_"):
        return {"kernel": dataclasses.replace(base.kernel, mlp_ratio=float(name.removeprefix("mlp_")))}
    raise ValueError(f"unknown ablation {name!r}: use {', '.join(FIXED_VARIANTS)}, tau_<value>, depth_<K> or "
                     "mlp_<ratio>")


def main_tau(cfg: PipelineConfig) -> float:
    return float(load_checkpoint(Path(cfg.run_dir) / DIRECTOR_FILE)["tau"])


def ablation_config(cfg: PipelineConfig, name: str) -> PipelineConfig:
    distil_cfg = dataclasses.replace(cfg.distil, epochs=cfg.evaluate.ablation_epochs, tau=main_tau(cfg))
    distil_cfg = dataclasses.replace(distil_cfg, **variant_overrides(name, distil_cfg))
    return dataclasses.replace(cfg, distil=distil_cfg, run_dir=str(Path(cfg.run_dir) / "ablations" / name))


def seed_config(cfg: PipelineConfig, seed: int) -> PipelineConfig:
    if seed == cfg.seed:
        return cfg
    distil_cfg = dataclasses.replace(cfg.distil, tau=main_tau(cfg))
    return dataclasses.replace(cfg, seed=seed, distil=distil_cfg,
                               run_dir=str(Path(cfg.run_dir) / "ablations" / f"seed{seed}"))


def link_backbone(source: Path, target: Path) -> None:
    """``target`` names the same frozen backbone file as ``source`` (a hard link, else a copy). ``source`` is resolved
    first: a main run's backbone may itself be a relative symbolic link (``calibrate``'s depth folders), which a hard
    link would copy as a link that dangles from the variant's folder."""
    if target.exists():
        return
    target.unlink(missing_ok=True)  # a dangling link left by an earlier attempt
    try:
        os.link(source.resolve(), target)  # no copy
    except OSError:
        shutil.copy2(source, target)


def ensure_distilled(main: PipelineConfig, variant: PipelineConfig) -> Path:
    """Distil ``variant`` (resuming a partial run) on the main run's backbone unless it is done."""
    run_dir = Path(variant.run_dir)
    if (run_dir / DIRECTOR_FILE).exists():
        return run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    link_backbone(Path(main.run_dir) / BACKBONE_FILE, run_dir / BACKBONE_FILE)
    tokenizer = Path(main.run_dir) / TOKENIZER_FILE  # text runs tokenise with the run's own tokenizer
    if tokenizer.exists() and not (run_dir / TOKENIZER_FILE).exists():
        shutil.copy2(tokenizer, run_dir / TOKENIZER_FILE)
    print(f"distilling variant {run_dir.name}")
    distil(variant)
    return run_dir
