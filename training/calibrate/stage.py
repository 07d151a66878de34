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
import re
import shutil
from pathlib import Path
from typing import Any

import yaml

from artifact.contract import MANIFEST, parse_manifest
from training.calibrate.depth_search import DistillationFailed, choose_depth
from training.calibrate.measured import Measured, comparison, comparison_line, write_comparison
from training.calibrate.plan import Plan, plan_run
from training.calibrate.preview import preview_data
from training.calibrate.run_config import RunConfig, run_config, run_folder
from training.config import PipelineConfig
from training.distil.stage import CHECKPOINT_FILE as DISTIL_CHECKPOINT_FILE
from training.export.backbone_accuracy import LessAccurateThanBackbone, backbone_warning
from training.export.stage import export
from training.export.verdict import PATH_NAMES
from training.families.checkpoint import inspect_checkpoint, parameter_count
from training.fit.backbone import CHECKPOINT_FILE as FIT_CHECKPOINT_FILE
from training.fit.backbone import fit_backbone
from training.loading import BACKBONE_FILE, DIRECTOR_FILE

MODEL_CARD = "README.md"  # beside the model's versions: the newest version's results page
# what a rerun resumes from: the backbone's fit and each depth's distillation, finished or stopped in an epoch
TRAINED_FILES = (FIT_CHECKPOINT_FILE, BACKBONE_FILE, DISTIL_CHECKPOINT_FILE, DIRECTOR_FILE,
                 f"depth-*/{DISTIL_CHECKPOINT_FILE}", f"depth-*/{DIRECTOR_FILE}")


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
    plan = plan_run(cfg, checkpoint, parameter_count(checkpoint), preview)
    print(plan.render(), flush=True)
    return run, cfg, plan


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
    resume, measured = not args.no_resume, Measured()
    with measured.stage("fit"):
        fit_backbone(cfg, resume=resume)
    try:
        with measured.stage("distil"):
            chosen = choose_depth(cfg, resume, args.nproc_per_node)
        with measured.stage("export"):
            version_dir = export(chosen, strict=args.strict)
    except (LessAccurateThanBackbone, DistillationFailed) as err:
        raise CalibrateError(str(err)) from err
    card = publish_model_card(cfg, version_dir)
    print(f"results page {Path(cfg.export.docs_dir) / f'{cfg.export.name}.md'}, model card {card}", flush=True)
    verdict = parse_manifest(json.loads((version_dir / MANIFEST).read_text())).kernel_verdict
    warned = " (less accurate than its backbone: see the warning above)" if backbone_warning(verdict) else ""
    record = comparison(plan, measured)
    write_comparison(Path(cfg.run_dir), record)
    print(comparison_line(record), flush=True)
    served = "" if verdict is None else (f", serving {PATH_NAMES[verdict.served]} by the kernel's verdict on three "
                                         f"paths (DIRECTOR, the hybrid, the post-hoc path; export.method "
                                         f"{verdict.requested})")
    print(f"wrote {version_dir}: {cfg.export.name} version {version_dir.name}{served}, which `make serve` "
          f"serves{warned}", flush=True)
    return 0
