"""Run ``python -m training calibrate``: write the run's config, summarise the data and print the plan (refusing a
run this machine cannot hold), then fit-backbone (the checkpoint converted; a missing head fitted), distil at each
depth candidate in its own sub-run, keep the depth with the best validation NLL, and export it. Every stage resumes
where it stopped, so rerunning the same command after an interruption goes on. With ``--nproc-per-node N`` each
depth is distilled in N DDP processes under torchrun."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from training.calibrate.plan import Plan, plan_run
from training.calibrate.preview import preview_data
from training.calibrate.run_config import CONFIG_FILE, build_run_config
from training.config import PipelineConfig, config_dict, load_config
from training.distil.stage import distil
from training.export.stage import export
from training.families.checkpoint import inspect_checkpoint, parameter_count
from training.fit.backbone import fit_backbone
from training.loading import BACKBONE_FILE, DIRECTOR_FILE
from training.runtime import load_checkpoint

SELECTION_FILE = "depth_selection.json"
DISTIL_CONFIG_FILE = "distil.yaml"  # a depth's sub-run config, for torchrun


class CalibrateError(ValueError):
    """What the user has to change before the run can start (the checkpoint, the data or the config), in one line."""
SHARED_FILES = (BACKBONE_FILE, "tokenizer.json", "images")  # what every depth's sub-run reads from the run


def prepare(args: argparse.Namespace, overrides: dict[str, Any]) -> tuple[PipelineConfig, Plan]:
    """The run's config (written, or read back on a rerun) and its plan, printed."""
    pretrained = (yaml.safe_load(Path(args.config).read_text()) or {}).get("pretrained", {}) if args.config else {}
    source = args.backbone or pretrained.get("source")  # a config may name its checkpoint (configs/calibrate/)
    if source is None:
        raise ValueError("--backbone is required (or a --config whose pretrained.source names the checkpoint)")
    model_args = overrides.get("pretrained.model_args", pretrained.get("model_args"))
    checkpoint = inspect_checkpoint(source, args.checkpoint or pretrained.get("checkpoint"), model_args)
    cfg = load_config(build_run_config(args, checkpoint, overrides))
    preview = preview_data(cfg, checkpoint)
    plan = plan_run(cfg, checkpoint, parameter_count(checkpoint), preview.tokens, preview.train_inputs,
                    preview.input_bytes, preview.summary, preview.stored_bytes)
    print(plan.render(), flush=True)
    return cfg, plan


def depth_config(cfg: PipelineConfig, depth: int) -> PipelineConfig:
    """The sub-run that distils depth K: its own folder beside the run's shared backbone and tokenizer."""
    run_dir = Path(cfg.run_dir) / f"depth-{depth}"
    run_dir.mkdir(parents=True, exist_ok=True)
    for name in SHARED_FILES:
        link, target = run_dir / name, Path(cfg.run_dir) / name
        if target.exists() and not link.exists():
            os.symlink(os.path.relpath(target, run_dir), link)
    sub = replace(cfg, run_dir=str(run_dir), distil=replace(cfg.distil, depth=depth))
    return replace(sub, source=str(Path(cfg.run_dir) / CONFIG_FILE))


def best_validation_nll(run_dir: Path) -> float:
    """The validation NLL of the epoch a finished distillation kept."""
    payload = load_checkpoint(run_dir / DIRECTOR_FILE)
    kept = payload["kept_epoch"]
    records = [r for r in payload["history"] if r["epoch"] == kept] or payload["history"][-1:]
    return float(records[0]["val_nll"])


def distil_under_torchrun(cfg: PipelineConfig, processes: int, resume: bool) -> None:
    """``distil`` of one depth's sub-run in ``processes`` DDP ranks (``torch.distributed.run``, one per GPU, or gloo
    on CPU): its config is written beside the sub-run, so the command can also be rerun by hand."""
    config = Path(cfg.run_dir) / DISTIL_CONFIG_FILE
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(yaml.safe_dump({k: v for k, v in config_dict(cfg).items() if k != "source"}, sort_keys=False))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}",
               "-m", "training", "distil", "--config", str(config), *([] if resume else ["--no-resume"])]
    print("running " + " ".join(command), flush=True)
    if subprocess.run(command, check=False).returncode != 0:
        raise CalibrateError(f"distillation under torchrun failed (see its output above); rerun it with: "
                             f"{' '.join(command[2:])}")


def choose_depth(cfg: PipelineConfig, resume: bool, processes: int = 1) -> PipelineConfig:
    """Distil every depth candidate (in ``processes`` DDP ranks when > 1) and return the sub-run of the one with the
    best validation NLL (ties: the smaller K, the cheaper artifact)."""
    scores: dict[int, float] = {}
    for depth in cfg.distil.depth_candidates or [cfg.distil.depth or 0]:
        sub = depth_config(cfg, depth) if depth else cfg
        if not (resume and (Path(sub.run_dir) / DIRECTOR_FILE).exists()):
            if processes > 1:
                distil_under_torchrun(sub, processes, resume)
            else:
                distil(sub, resume=resume)
        scores[depth] = best_validation_nll(Path(sub.run_dir))
        print(f"depth K={depth}: validation NLL {scores[depth]:.4f}", flush=True)
    chosen = min(scores, key=lambda k: (round(scores[k], 4), k))
    record = {"validation_nll": {str(k): v for k, v in scores.items()}, "chosen": chosen}
    (Path(cfg.run_dir) / SELECTION_FILE).write_text(json.dumps(record, indent=2) + "\n")
    print(f"chosen depth K={chosen}", flush=True)
    return depth_config(cfg, chosen) if chosen else cfg


def calibrate(args: argparse.Namespace, overrides: dict[str, Any]) -> int:
    try:  # an unsupported checkpoint, bad data or a config that cannot work: all found before any training
        cfg, plan = prepare(args, overrides)
    except (ValueError, FileNotFoundError) as err:
        raise CalibrateError(str(err)) from err
    problems = plan.problems()
    for problem in problems:
        print(f"will not fit: {problem}", flush=True)
    if args.dry_run:
        print(f"dry run: nothing trained; the config is {Path(cfg.run_dir) / CONFIG_FILE}", flush=True)
        return 0 if not problems else 2
    if problems and not args.force:
        print("refusing to start (--force starts anyway)", flush=True)
        return 2
    resume = not args.no_resume
    fit_backbone(cfg, resume=resume)
    export(choose_depth(cfg, resume, args.nproc_per_node))
    return 0
