"""Run ``python -m training calibrate``: summarise the data and print the plan (refusing a run this machine cannot
hold or the server could not serve), write the run's config, then fit-backbone (the checkpoint converted; a missing
head fitted), distil at each depth candidate in its own sub-run, keep the depth with the best validation NLL, export
it (with ``--strict``, never a version less accurate than its backbone) and put its results page beside it as the
model's card. Every stage resumes where it stopped, so rerunning the same command after an interruption goes on
(``training.calibrate.run_config`` says when a rerun resumes). With ``--nproc-per-node N`` each depth is distilled in
N DDP processes under torchrun."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from artifact.contract import MANIFEST, parse_manifest
from training.calibrate.plan import Plan, plan_run
from training.calibrate.preview import preview_data
from training.calibrate.run_config import CONFIG_FILE, RunConfig, run_config, run_folder
from training.config import PipelineConfig, config_dict
from training.distil.stage import CHECKPOINT_FILE as DISTIL_CHECKPOINT_FILE
from training.distil.stage import distil
from training.export.backbone_accuracy import LessAccurateThanBackbone, backbone_warning
from training.export.stage import export
from training.families.checkpoint import inspect_checkpoint, parameter_count
from training.fit.backbone import CHECKPOINT_FILE as FIT_CHECKPOINT_FILE
from training.fit.backbone import fit_backbone
from training.loading import BACKBONE_FILE, DIRECTOR_FILE
from training.runtime import load_checkpoint

SELECTION_FILE = "depth_selection.json"
DISTIL_CONFIG_FILE = "distil.yaml"  # a depth's sub-run config, for torchrun
MODEL_CARD = "README.md"  # beside the model's versions: the newest version's results page
# what a rerun resumes from: the backbone's fit and each depth's distillation, finished or stopped in an epoch
TRAINED_FILES = (FIT_CHECKPOINT_FILE, BACKBONE_FILE, DISTIL_CHECKPOINT_FILE, DIRECTOR_FILE,
                 f"depth-*/{DISTIL_CHECKPOINT_FILE}", f"depth-*/{DIRECTOR_FILE}")
SHARED_FILES = (BACKBONE_FILE, "tokenizer.json", "images")  # what every depth's sub-run reads from the run


class CalibrateError(ValueError):
    """What the user has to change before the run can start (the checkpoint, the data or the config), in one line."""


def trained_files(run_dir: Path) -> list[str]:
    """The files in ``run_dir`` a rerun would resume from (none: nothing was trained there)."""
    return sorted(str(p.relative_to(run_dir)) for pattern in TRAINED_FILES for p in run_dir.glob(pattern))


def prepare(args: argparse.Namespace, overrides: dict[str, Any]) -> tuple[RunConfig, PipelineConfig, Plan]:
    """The run's config (new, or the run folder's when it resumes trained files; not written yet) and its plan,
    printed."""
    pretrained = (yaml.safe_load(Path(args.config).read_text()) or {}).get("pretrained", {}) if args.config else {}
    source = args.backbone or pretrained.get("source")  # a config may name its checkpoint (configs/calibrate/)
    if source is None:
        raise ValueError("--backbone is required (or a --config whose pretrained.source names the checkpoint)")
    model_args = overrides.get("pretrained.model_args", pretrained.get("model_args"))
    checkpoint = inspect_checkpoint(source, args.checkpoint or pretrained.get("checkpoint"), model_args)
    run = run_config(args, checkpoint, overrides, trained_files(run_folder(args)))
    cfg = run.config()
    preview = preview_data(cfg, checkpoint)
    plan = plan_run(cfg, checkpoint, parameter_count(checkpoint), preview.tokens, preview.train_inputs,
                    preview.input_bytes, preview.summary, preview.stored_bytes)
    print(plan.render(), flush=True)
    return run, cfg, plan


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


def depth_search_line(candidates: list[int], to_run: list[int]) -> str:
    """What the depth search will do: the candidates, those it distils and those distilled before (resumed)."""
    done = [k for k in candidates if k not in to_run]
    line = f"depth search: K in {candidates}, distilling {len(to_run)}" + (f" (K in {to_run})" if to_run else "")
    return line + (f"; K in {done} distilled before, resumed" if done else "")


def choose_depth(cfg: PipelineConfig, resume: bool, processes: int = 1) -> PipelineConfig:
    """Distil every depth candidate (in ``processes`` DDP ranks when > 1) and return the sub-run of the one with the
    best validation NLL (ties: the smaller K, the cheaper artifact)."""
    subs = {depth: depth_config(cfg, depth) if depth else cfg
            for depth in cfg.distil.depth_candidates or [cfg.distil.depth or 0]}
    to_run = [k for k, sub in subs.items() if not (resume and (Path(sub.run_dir) / DIRECTOR_FILE).exists())]
    print(depth_search_line(list(subs), to_run), flush=True)
    scores: dict[int, float] = {}
    for depth, sub in subs.items():
        if depth in to_run:
            print(f"depth {to_run.index(depth) + 1} of {len(to_run)}: distilling K={depth}", flush=True)
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


def publish_model_card(cfg: PipelineConfig, version_dir: Path) -> Path:
    """The exported version's results page, as its model's card beside the versions (``MODEL_CARD``), with the
    images it shows: a user's results go with the user's model, never into the project's docs."""
    docs, model_dir = Path(cfg.export.docs_dir), version_dir.parent
    page = (docs / f"{cfg.export.name}.md").read_text()
    for image in re.findall(r"!\[[^\]]*\]\(([^)/]+)\)", page):  # the page's own images, beside it
        if (docs / image).is_file():
            shutil.copyfile(docs / image, model_dir / image)
    (model_dir / MODEL_CARD).write_text(page)
    return model_dir / MODEL_CARD


def dry_run_end(run: RunConfig) -> str:
    """The dry run's last line: where its config is, or, over trained files, that it changed nothing they follow."""
    trained = ", ".join(run.trained)
    if not trained:
        run.write()  # a run folder with nothing trained is built again from the next command: this changes no run
        return f"dry run: nothing trained; the config is {run.path}"
    if run.resumes:
        return (f"dry run: nothing trained or written; the run resumes from {trained} with {run.path} and this "
                "command's export and --set values")
    return f"dry run: nothing trained or written; the run (--no-resume) replaces {trained} and {run.path}"


def calibrate(args: argparse.Namespace, overrides: dict[str, Any]) -> int:
    try:  # an unsupported checkpoint, bad data or a config that cannot work: all found before any training
        run, cfg, plan = prepare(args, overrides)
    except (ValueError, FileNotFoundError) as err:
        raise CalibrateError(str(err)) from err
    problems = plan.problems()
    for problem in problems:
        print(f"will not fit: {problem}", flush=True)
    if args.dry_run:
        print(dry_run_end(run), flush=True)
        return 0 if not problems else 2
    if problems and not args.force:
        print("refusing to start (--force starts anyway)", flush=True)
        return 2
    run.write()
    if run.resumes:
        print(f"resuming the run in {run.path.parent} from {', '.join(run.trained)}", flush=True)
    resume = not args.no_resume
    fit_backbone(cfg, resume=resume)
    try:
        version_dir = export(choose_depth(cfg, resume, args.nproc_per_node), strict=args.strict)
    except LessAccurateThanBackbone as err:
        raise CalibrateError(str(err)) from err
    card = publish_model_card(cfg, version_dir)
    print(f"results page {Path(cfg.export.docs_dir) / f'{cfg.export.name}.md'}, model card {card}", flush=True)
    verdict = parse_manifest(json.loads((version_dir / MANIFEST).read_text())).kernel_verdict
    warned = " (less accurate than its backbone: see the warning above)" if backbone_warning(verdict) else ""
    print(f"wrote {version_dir}: {cfg.export.name} version {version_dir.name}, which `make serve` serves{warned}",
          flush=True)
    return 0
