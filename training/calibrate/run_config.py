"""The config of a calibrate run, built from the command line on top of a base config (``configs/calibrate/<modality>
.yaml`` or ``--config``) and written to ``<run_dir>/calibrate.yaml``, so every stage and a rerun read the same thing
(``python -m training all --config runs/<name>/calibrate.yaml`` reproduces it stage by stage).

A rerun resumes only from trained files, with the config they were made from: a run folder holding none (a dry run's,
or one stopped before its first checkpoint) is built again from the command. A rerun whose checkpoint, data or columns
differ from the trained files' is refused, naming each difference and ``--no-resume`` (docs/your-own-model.md says
why). What only the export reads (``--method``, ``--ood-validation``, ``--version``) applies to a resumed run too,
since the export always runs again. A user's results page goes to the run folder, never to the project's docs."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from artifact.contract import is_published
from training.config import USER_IMAGE_DATASET, USER_TEXT_DATASET, PipelineConfig, check_config, validated
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


def run_folder(args: argparse.Namespace) -> Path:
    return Path(args.run_dir or f"runs/{args.name}")


def _set(raw: dict[str, Any], dotted: str, value: Any) -> None:
    node = raw
    *parents, leaf = dotted.split(".")
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value


@dataclass
class RunConfig:
    """The run's config, not yet written: built from the command, or (``resumes``) the run folder's own with what
    the command changes in the export, to go on from its ``trained`` files."""

    path: Path  # <run_dir>/calibrate.yaml
    raw: dict[str, Any]
    header: str  # the comment above the YAML
    trained: list[str]  # the files in the run folder a rerun would resume from
    resumes: bool

    def config(self) -> PipelineConfig:
        """Typed and checked as ``load_config`` reads the file."""
        cfg = validated(self.raw)
        cfg.source = str(self.path)
        check_config(cfg)
        return cfg

    def write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(self.header + yaml.safe_dump(self.raw, sort_keys=False))


def export_values(args: argparse.Namespace) -> dict[str, Any]:
    """What the command sets that only the export reads (a resumed run exports again, so these apply to it too)."""
    values: dict[str, Any] = {"export.docs_dir": str(run_folder(args))}  # the user's results stay in the run folder
    if args.method:
        values["export.method"] = args.method
    if args.ood_validation:
        values["export.ood_validation_data"] = str(Path(args.ood_validation).resolve())
    if args.version:
        values["export.version"] = args.version
    return values


def changed_inputs(recorded: PipelineConfig, args: argparse.Namespace, checkpoint: Checkpoint) -> list[str]:
    """The inputs the command names that differ from those the run's trained files were made from, each as its flag,
    the command's value and the run's (a flag left out keeps the run's value)."""
    pairs = [("--backbone", checkpoint.source, recorded.pretrained.source, True),
             ("--checkpoint", checkpoint.weights, recorded.pretrained.checkpoint, True),
             ("--data", args.data, recorded.data.root, True),
             ("--text-column", args.text_column, recorded.data.text_column, False),
             ("--label-column", args.label_column, recorded.data.label_column, False)]
    return [f"{flag} {given} (the run's: {kept})" for flag, given, kept, path in pairs
            if given is not None and not _same(given, kept, path)]


def _same(given: str, kept: str | None, path: bool) -> bool:
    """Paths (or hub ids) name the same thing when they resolve to the same place from here."""
    if kept is None or not path:
        return given == kept
    return os.path.realpath(given) == os.path.realpath(kept)


def resumed_config(args: argparse.Namespace, checkpoint: Checkpoint, overrides: dict[str, Any], trained: list[str]
                   ) -> RunConfig:
    """The run folder's config, with the command's export values and ``--set`` values, when the command names the
    inputs its ``trained`` files were made from; else the error naming the differences and the flag that starts
    fresh."""
    run_dir = run_folder(args)
    path = run_dir / CONFIG_FILE
    fresh = ("rerun with --no-resume to start it again from this command (its trained files are replaced), or give "
             "another --name or --run-dir")
    if not path.is_file():
        raise ValueError(f"{run_dir} holds trained files ({', '.join(trained)}) but no {CONFIG_FILE} saying what "
                         f"they were made from: {fresh}")
    raw = yaml.safe_load(path.read_text()) or {}
    changed = changed_inputs(RunConfig(path, raw, "", trained, True).config(), args, checkpoint)
    if changed:
        raise ValueError(f"{run_dir} holds a run trained from other inputs than this command names: "
                         f"{'; '.join(changed)}. To resume it, give its own values; to use these, {fresh}")
    for dotted, value in {"run_dir": str(run_dir), **export_values(args), **overrides}.items():
        _set(raw, dotted, value)  # the run goes on where its trained files are, wherever it was first started
    return RunConfig(path, raw, "", trained, True)


def new_config(args: argparse.Namespace, checkpoint: Checkpoint, overrides: dict[str, Any], trained: list[str]
               ) -> RunConfig:
    """The run's config for this checkpoint and data, from the base config and the command alone (``trained``: the
    files in the run folder it replaces)."""
    run_dir = run_folder(args)
    modality = checkpoint.family.modality
    base = Path(args.config) if args.config else BASE_CONFIGS / f"{modality}.yaml"
    raw: dict[str, Any] = yaml.safe_load(base.read_text()) or {}
    repository = Path(args.repository or raw.get("export", {}).get("repository", "model_repository"))
    values: dict[str, Any] = {
        "name": args.name, "modality": modality, "run_dir": str(run_dir),
        "pretrained.source": checkpoint.source, "pretrained.checkpoint": checkpoint.weights,
        "pretrained.model_args": checkpoint.model_args,
        "export.name": args.name, "export.repository": str(repository),
        "export.version": next_version(repository, args.name), **export_values(args),
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
    if args.text_column:
        values["data.text_column"] = args.text_column
    if args.label_column:
        values["data.label_column"] = args.label_column
    values.update(task_values(args, checkpoint))
    if checkpoint.labels is not None and not raw.get("data", {}).get("labels"):
        values["data.labels"] = checkpoint.labels  # the head's classes, in its index order
    for dotted, value in {**values, **overrides}.items():
        _set(raw, dotted, value)
    candidates = depth_candidates(raw.get("distil", {}).get("depth_candidates") or [], checkpoint.layers)
    _set(raw, "distil.depth_candidates", candidates)
    header = f"# written by python -m training calibrate from {base}\n"
    return RunConfig(run_dir / CONFIG_FILE, raw, header, trained, False)


def task_values(args: argparse.Namespace, checkpoint: Checkpoint) -> dict[str, Any]:
    """A multi-label run's ``task`` section: asked for (``--multi-label``, ``--label-columns``) or the checkpoint's
    ``problem_type``; nothing for a single-label one."""
    columns = [c.strip() for c in (getattr(args, "label_columns", None) or "").split(",") if c.strip()]
    if not (getattr(args, "multi_label", False) or columns or checkpoint.multi_label):
        return {}
    return {"task.kind": "multi_label", **({"task.label_columns": columns} if columns else {})}


def run_config(args: argparse.Namespace, checkpoint: Checkpoint, overrides: dict[str, Any], trained: list[str]
               ) -> RunConfig:
    """The config a calibrate command runs with: the run folder's, resumed, when it holds ``trained`` files (and
    ``--no-resume`` is not given), else a new one."""
    if trained and not args.no_resume:
        return resumed_config(args, checkpoint, overrides, trained)
    return new_config(args, checkpoint, overrides, trained)
