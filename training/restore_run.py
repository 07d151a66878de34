"""Rebuild a lost image run directory (``backbone.pt`` and ``director.pt``) from committed artifacts, so a model can be
re-exported (a new version, e.g. one whose artifact carries the backbone's last transitions) without training again.

The backbone's weights come from its deterministic baseline artifact (``export-baseline --method deterministic``),
the kernel's and the readout's from the DIRECTOR artifact, and what the exporter reads beside the weights (tau, the
floors, the per-step statistics, the distillation history, stage times) from the DIRECTOR manifest. Image artifacts
only: a text artifact drops its adaLN weights once they are folded, so its kernel cannot be rebuilt from it.

    python -m training.restore_run --config configs/fashion_vit.yaml \\
        --director model_repository/fashion-vit/2 --backbone model_repository/fashion-vit-deterministic/1
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch

from artifact.contract import ARTIFACT, Manifest, parse_manifest, read_document
from models.backbones import build_vit, unfold_batch_norms
from models.kernel import KernelConfig
from training.config import PipelineConfig, config_dict, load_config
from training.families.registry import family_of
from training.loading import BACKBONE_FILE, DIRECTOR_FILE
from training.posthoc.writing import load_scripted
from training.runtime import save_checkpoint

RESTORED = "restored from committed artifacts"
DESCRIBED = {"deterministic": "a deterministic image artifact", "director": "an image DIRECTOR artifact"}


def prefixed(state: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """The entries of ``state`` under ``prefix``, with the prefix removed."""
    return {k[len(prefix):]: v.clone() for k, v in state.items() if k.startswith(prefix)}


def artifact_manifest(folder: Path, method: str) -> Manifest:
    """The typed manifest of an image artifact of ``method``; anything else cannot rebuild this run."""
    manifest = parse_manifest(read_document(folder))
    if manifest.method != method or manifest.modality != "image":
        raise ValueError(f"{folder} is not {DESCRIBED[method]}")
    return manifest


def backbone_payload(cfg: PipelineConfig, folder: Path, seconds: float) -> dict[str, Any]:
    """``backbone.pt`` from a deterministic baseline artifact of the same backbone."""
    artifact_manifest(folder, "deterministic")
    weights = prefixed(load_scripted(folder / ARTIFACT).state_dict(), "classifier.")
    weights = unfold_batch_norms(weights, build_vit(cfg.backbone))  # an artifact's stem has its norms folded
    payload = {"backbone_config": config_dict(cfg)["backbone"], "state_dict": weights}
    family_of("vit").build_backbone(payload)  # the weights fit the config's backbone, key for key
    return {**payload, "config": config_dict(cfg), "history": [], "test": {}, "seconds": seconds,
            "restored": RESTORED, "source": str(folder)}


def director_payload(cfg: PipelineConfig, folder: Path) -> dict[str, Any]:
    """``director.pt`` from an image DIRECTOR artifact and its manifest."""
    manifest = artifact_manifest(folder, "director")
    sampling, variance, prov = manifest.sampling, manifest.variance, provenance_record(manifest)
    if sampling.depth is None or sampling.backbone_steps is None or variance is None:
        raise ValueError(f"{folder}'s manifest does not record the depth, the backbone's steps and the variance")
    state = load_scripted(folder / ARTIFACT).state_dict()
    kernel = prefixed(state, "rollout.kernel.")
    if "mean_head.weight" not in kernel:
        raise ValueError(f"{folder}'s kernel is folded for serving: its own weights cannot be rebuilt from it")
    dcfg = cfg.distil
    config = KernelConfig(dim=int(kernel["mean_head.weight"].shape[0]), num_heads=cfg.backbone.num_heads,
                          depth=sampling.depth, mlp_ratio=dcfg.kernel.mlp_ratio,
                          frequency_embedding_size=dcfg.kernel.frequency_embedding_size,
                          logvar_min=kernel["logvar_min"], logvar_max=kernel["logvar_max"])
    return {
        "kernel": kernel, "kernel_config": config.document(),
        "readout": prefixed(state, "readout.") if dcfg.finetune_readout else None,
        "depth": config.depth, "backbone_steps": sampling.backbone_steps,
        "kept_epoch": prov["distil_kept_epoch"], "tau": variance.tau,
        "tau_accuracies": variance.tau_selection_accuracy or {}, "floors": variance.floors,
        "stats": prov["step_statistics"], "observed_variance": variance.observed_variance,
        "history": prov["distil_history"], "seconds": prov["seconds"]["distil"], "config": config_dict(cfg),
        "restored": RESTORED, "source": str(folder),
    }


def provenance_record(manifest: Manifest) -> dict[str, Any]:
    """What the exporter recorded beyond the contract's provenance fields (stage times, step statistics, the
    distillation history and kept epoch): the provenance section's own extra keys."""
    return (manifest.provenance.model_extra or {}) if manifest.provenance is not None else {}


def restore_run(cfg: PipelineConfig, director: Path, backbone: Path) -> Path:
    """Write ``backbone.pt`` and ``director.pt`` into the config's (missing) run directory; returns it."""
    run = Path(cfg.run_dir)
    if (run / BACKBONE_FILE).exists() or (run / DIRECTOR_FILE).exists():
        raise FileExistsError(f"{run} already holds a run: restore only into an empty run directory")
    fit_seconds = provenance_record(parse_manifest(read_document(director)))["seconds"]["fit_backbone"]
    backbone_state = backbone_payload(cfg, backbone, fit_seconds)
    director_state = director_payload(cfg, director)
    run.mkdir(parents=True, exist_ok=True)
    save_checkpoint(run / BACKBONE_FILE, backbone_state)
    save_checkpoint(run / DIRECTOR_FILE, director_state)
    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.restore_run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--director", type=Path, required=True, help="an image DIRECTOR artifact folder")
    parser.add_argument("--backbone", type=Path, required=True, help="its deterministic baseline artifact folder")
    args = parser.parse_args(argv)
    run = restore_run(load_config(args.config), args.director, args.backbone)
    print(f"restored {run} from {args.director} and {args.backbone}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
