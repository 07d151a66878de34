"""Command line of the offline pipeline: calibrate (a user's pretrained checkpoint and data to a served model in one
command), and the stages fit-backbone, distil, export, evaluate, export-baseline (each driven by a YAML config)."""

from __future__ import annotations

import argparse
import shlex
import sys
import warnings

from training.config import load_config, set_overrides


def add_calibrate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("calibrate", help="your pretrained checkpoint + labelled data -> a served DIRECTOR model",
                       description="Convert a pretrained classifier, distil it at a few depths, keep the best on "
                                   "validation and export it into the model repository (docs/your-own-model.md).")
    p.add_argument("--backbone", help="a Hugging Face checkpoint folder or hub id, or timm:<model name>")
    p.add_argument("--checkpoint", help="the weights file of a timm:<model name> backbone")
    p.add_argument("--data", help="an image folder (one sub-folder per class), a CSV / JSONL / Parquet file or a "
                                  "folder of them, or a datasets folder / hub id")
    p.add_argument("--name", required=True, help="the model's name in the repository")
    p.add_argument("--dry-run", action="store_true", help="print the data summary and the plan, then stop")
    p.add_argument("--config", help="a base config to start from (default: configs/calibrate/<modality>.yaml)")
    p.add_argument("--text-column", help="the texts' column (default: text)")
    p.add_argument("--label-column", help="the labels' column (default: label); multi-label: each row's list")
    p.add_argument("--multi-label", action="store_true",
                   help="a sigmoid per label (implied by a checkpoint's problem_type multi_label_classification)")
    p.add_argument("--label-columns", metavar="A,B,C",
                   help="multi-label data as one 0/1 column per label, named in the head's order")
    p.add_argument("--ood-validation", metavar="PATH",
                   help="inputs the model should flag, nearer your domain than the built-in sets: a folder of PNG / "
                        "JPEG images or a text file with one input per line; it chooses the served OOD score and "
                        "nothing else, so keep it apart from anything you report on")
    p.add_argument("--method", choices=["auto", "director", "hybrid", "posthoc"],
                   help="what the version serves: auto (default) weighs three paths paired on validation, each richer "
                        "one served only where it gains beyond noise and a practical margin over every cheaper one and "
                        "loses nowhere: DIRECTOR (sampled logits), the hybrid (your backbone's own labels with the "
                        "kernel's error as uncertainty signal), the post-hoc path (your backbone with the same "
                        "post-hoc tools; docs/your-own-model.md)")
    p.add_argument("--strict", action="store_true",
                   help="refuse to publish a version less accurate than your backbone (on validation or the test "
                        "split, beyond noise); without it such a version is published with a warning")
    p.add_argument("--repository", help="the model repository to export into (default: model_repository)")
    p.add_argument("--version", type=int, help="the version to export (default: one past the highest)")
    p.add_argument("--run-dir", help="where the run's files go (default: runs/<name>)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value, e.g. --set distil.epochs=2")
    p.add_argument("--force", action="store_true", help="start even when the plan says it will not fit")
    p.add_argument("--no-resume", action="store_true", help="start from scratch instead of resuming")
    p.add_argument("--nproc-per-node", type=int, default=1, metavar="N",
                   help="distil in N DDP processes under torchrun (one per GPU; default 1: in this process)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m training", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    add_calibrate(sub)
    for name, help_text in [
        ("fit-backbone", "train the backbone classifier"),
        ("distil", "distil the backbone into the DIRECTOR transition kernel"),
        ("export", "export director.ts + manifest.json into the model repository"),
        ("all", "fit-backbone, distil and export in turn (each resumes or skips finished work)"),
        ("evaluate", "compare DIRECTOR with the baselines: docs/results/<task>.md + .json + plots (resumable)"),
        ("export-baseline", "export a baseline (deterministic, mc_dropout, ensemble, kep_svgp) as a servable artifact"),
    ]:
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--config", required=True, help="YAML config in configs/")
        p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="override a config value, e.g. --set distil.epochs=1")
        p.add_argument("--no-resume", action="store_true", help="start from scratch instead of resuming")
        if name == "distil":
            p.add_argument("--until-epoch", type=int, help="stop after this epoch (a depth search's probe; the "
                           "schedule still spans distil.epochs, so a later run goes on from it)")
        if name == "export-baseline":
            from training.baselines.builders import BASELINES

            p.add_argument("--method", required=True, choices=BASELINES)
            p.add_argument("--repository", help="model repository to write into (default: export.repository)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    warnings.filterwarnings("ignore", message=".*torch.jit.*deprecated.*", category=FutureWarning)
    if args.command == "calibrate":
        return run_calibrate(args)
    cfg = load_config(args.config, set_overrides(args.set))
    resume = not args.no_resume
    if args.command in ("fit-backbone", "all"):
        from training.fit.backbone import fit_backbone

        fit_backbone(cfg, resume=resume)
    if args.command in ("distil", "all"):
        from training.distil.stage import distil

        distil(cfg, resume=resume, until=getattr(args, "until_epoch", None))
    if args.command in ("export", "all"):
        from training.export.stage import export

        export(cfg)
    if args.command == "evaluate":
        from training.evaluate.stage import evaluate

        evaluate(cfg, "python -m training " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:])))
    if args.command == "export-baseline":
        from training.baselines.export import export_baseline

        export_baseline(cfg, args.method, args.repository)
    return 0


def run_calibrate(args: argparse.Namespace) -> int:
    """``calibrate``, with a user's mistakes (an unsupported checkpoint, bad data, a config that cannot work) told in
    one line on stderr and exit status 2, never a traceback."""
    from training.calibrate.stage import CalibrateError, calibrate
    from training.data.sources import DataError
    from training.families.checkpoint import CheckpointError
    from training.families.registry import UnsupportedBackbone

    try:
        return calibrate(args, set_overrides(args.set))
    except (CalibrateError, CheckpointError, DataError, UnsupportedBackbone) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
