"""Baselines on the pipeline's own backbone (deterministic, MC dropout, deep ensemble, KEP-SVGP) as modules under the
artifact contract, shared by the evaluation and ``export-baseline``.

Ensemble members are ordinary backbone fits with another seed, cached as checkpoints under
``<run_dir>/baselines/ensemble-seed<k>/`` (member 0 is the pipeline's backbone), so an interrupted evaluation resumes
and a rerun trains nothing. Fitting a missing member runs the fit-backbone stage: this module orchestrates it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch

from models.backbones import ImageClassifier
from models.baselines import DeterministicModel, EnsembleModel, MCDropoutModel
from models.bert_view import BertTransitionView
from models.text_backbones import TextClassifier
from models.text_director import TextBackbone
from training.baselines.kep_svgp import KEP_SVGP_FILE, kep_svgp_dir, load_kep_svgp, train_kep_svgp
from training.config import PipelineConfig
from training.fit.backbone import fit_backbone
from training.loading import BACKBONE_FILE, load_backbone

BASELINES = ("deterministic", "mc_dropout", "ensemble", "kep_svgp")


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


def text_baseline(cfg: PipelineConfig, method: str, train_missing: bool) -> BaselineModel:
    """The plain text backbone rebuilt from plain modules (the only text baseline that scripts), or the KEP-SVGP
    classifier (eager; fine-tuned first when the run has none)."""
    if method == "kep_svgp":
        return kep_svgp_baseline(cfg, train_missing)
    if method != "deterministic":
        raise ValueError(f"text baselines export as artifacts for method deterministic only, not {method!r}: "
                         "transformers modules do not script, and only the plain backbone is rebuilt from plain "
                         "modules (the evaluation still measures MC dropout and ensembles on texts)")
    backbone = load_backbone(cfg.run_dir)
    assert isinstance(backbone, TextClassifier)
    tcfg = cfg.text
    module = TextBackbone.from_view(BertTransitionView(backbone), tcfg.table_dtype, tcfg.max_length, tcfg.layer_dtype)
    return BaselineModel(module, 1, 1)


def image_baseline(cfg: PipelineConfig, method: str, train_missing: bool) -> BaselineModel:
    backbone = load_backbone(cfg.run_dir)
    if method == "deterministic":
        return BaselineModel(DeterministicModel(backbone).eval(), 1, 1)
    if method == "mc_dropout":
        samples = cfg.evaluate.samples
        return BaselineModel(MCDropoutModel(backbone).eval(), samples, max(samples, cfg.export.max_samples))
    if method == "ensemble":
        members = ensemble_members(cfg, cfg.evaluate.ensemble_members, train_missing)
        return BaselineModel(EnsembleModel(members).eval(), len(members), len(members))
    if method == "kep_svgp":
        return kep_svgp_baseline(cfg, train_missing)
    raise ValueError(f"unknown baseline {method!r}; choose from {BASELINES}")


def kep_svgp_baseline(cfg: PipelineConfig, train_missing: bool) -> BaselineModel:
    """The run's KEP-SVGP classifier (``training.baselines.kep_svgp``), fine-tuned first when the run has none, sampled
    with the evaluation's S as DIRECTOR is."""
    if train_missing and not (kep_svgp_dir(cfg) / KEP_SVGP_FILE).exists():
        train_kep_svgp(cfg)
    samples = cfg.evaluate.samples
    return BaselineModel(load_kep_svgp(cfg), samples, max(samples, cfg.export.max_samples))


BASELINE_BUILDERS = {"image": image_baseline, "text": text_baseline}


def build_baseline(cfg: PipelineConfig, method: str, train_missing: bool = True) -> BaselineModel:
    return BASELINE_BUILDERS[cfg.modality](cfg, method, train_missing)
