"""The config of a calibrate run, built from the command line on top of a base config (``configs/calibrate/<modality>
.yaml`` or ``--config``) and written to ``<run_dir>/calibrate.yaml``, so every stage and a rerun read the same thing
(``python -m training all --config runs/<name>/calibrate.yaml`` reproduces it stage by stage)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import yaml

from artifact.contract import is_published
from training.config import USER_IMAGE_DATASET, USER_TEXT_DATASET, PipelineConfig, load_config
from training.families.checkpoint import Checkpoint

CONFIG_FILE = "calibrate.yaml"
BASE_CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "calibrate"


def next_version(repository: Path, name: str) -> int:
    """One past the highest published version of ``name`` (1 for a new model)."""
    folder = repository / name
    if not folder.is_dir():
        return 1
    return max((int(p.name) for p in folder.iterdir() if is_published(p) and p.name.isdigit()), default=0) + 1


def depth_candidates(requested: list[int], layers: int) -> list[int]:
    """The depths K to distil and compare: the requested ones that fit the backbone, else 1, 2 and a quarter of the
    stack (the authors diffuse the last 5 of Qwen-2.5-0.5B's 24 layers)."""
    chosen = requested or [1, 2, max(1, layers // 4)]
    return sorted({k for k in chosen if 1 <= k <= layers})


def _set(raw: dict[str, Any], dotted: str, value: Any) -> None:
    node = raw
    *parents, leaf = dotted.split(".")
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value


def build_run_config(args: argparse.Namespace, checkpoint: Checkpoint, overrides: dict[str, Any]) -> Path:
    """Write ``<run_dir>/calibrate.yaml`` for this checkpoint and data (the same one again on a rerun: a resumed run
    keeps its version and its choices) and return its path."""
    run_dir = Path(args.run_dir or f"runs/{args.name}")
    path = run_dir / CONFIG_FILE
    if path.exists() and not args.no_resume:  # a rerun resumes with its choices, plus what --set changes now
        raw = yaml.safe_load(path.read_text()) or {}
        for dotted, value in overrides.items():
            _set(raw, dotted, value)
        path.write_text(yaml.safe_dump(raw, sort_keys=False))
        print(f"resuming the run in {run_dir} ({CONFIG_FILE}{' with the new --set values' if overrides else ''})")
        return path
    modality = checkpoint.family.modality
    base = Path(args.config) if args.config else BASE_CONFIGS / f"{modality}.yaml"
    raw: dict[str, Any] = yaml.safe_load(base.read_text()) or {}
    repository = Path(args.repository or raw.get("export", {}).get("repository", "model_repository"))
    values: dict[str, Any] = {
        "name": args.name, "modality": modality, "run_dir": str(run_dir),
        "pretrained.source": checkpoint.source, "pretrained.checkpoint": checkpoint.weights,
        "pretrained.model_args": checkpoint.model_args,
        "export.name": args.name, "export.repository": str(repository),
        "export.version": args.version or next_version(repository, args.name),
    }
    if args.data is not None:
        values.update({"data.root": args.data,
                       "data.dataset": USER_IMAGE_DATASET if modality == "image" else USER_TEXT_DATASET})
    if modality == "image" and checkpoint.image_shape is not None:
        values["data.image_shape"] = list(checkpoint.image_shape)
    if modality == "text":
        values.update({"text.backbone": "pretrained", "text.tokenizer": "pretrained"})
        base_length = raw.get("text", {}).get("max_length", 128)
        if checkpoint.max_positions is not None and base_length > checkpoint.max_positions:
            values["text.max_length"] = checkpoint.max_positions  # the position table's length
    if args.method:
        values["export.method"] = args.method
    if args.ood_validation:
        values["export.ood_validation_data"] = str(Path(args.ood_validation).resolve())
    if args.text_column:
        values["data.text_column"] = args.text_column
    if args.label_column:
        values["data.label_column"] = args.label_column
    if checkpoint.labels is not None and not raw.get("data", {}).get("labels"):
        values["data.labels"] = checkpoint.labels  # the head's classes, in its index order
    for dotted, value in {**values, **overrides}.items():
        _set(raw, dotted, value)
    candidates = depth_candidates(raw.get("distil", {}).get("depth_candidates") or [], checkpoint.layers)
    _set(raw, "distil.depth_candidates", candidates)
    run_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(f"# written by python -m training calibrate from {base}\n" + yaml.safe_dump(raw, sort_keys=False))
    return path


def load_run_config(path: Path) -> PipelineConfig:
    return load_config(path)
