"""Command line of the offline pipeline: fit-backbone, distil, export, evaluate, export-baseline (each driven by a
YAML config)."""

from __future__ import annotations

import argparse
import shlex
import sys
import warnings
from typing import Any

import yaml

from training.config import load_config


def _overrides(pairs: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"--set expects key=value, got {pair!r}")
        out[key] = yaml.safe_load(value)
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m training", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_text in [
        ("fit-backbone", "train the backbone classifier"),
        ("distil", "distil the backbone into the DIRECTOR transition kernel"),
        ("export", "export director.ts + manifest.json into the model repository"),
        ("all", "fit-backbone, distil and export in turn (each resumes or skips finished work)"),
        ("evaluate", "compare DIRECTOR with the baselines: docs/results/<task>.md + .json + plots (resumable)"),
        ("export-baseline", "export a baseline (deterministic, mc_dropout, ensemble) as a servable artifact"),
    ]:
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--config", required=True, help="YAML config in configs/")
        p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="override a config value, e.g. --set distil.epochs=1")
        p.add_argument("--no-resume", action="store_true", help="start from scratch instead of resuming")
        if name == "export-baseline":
            from training.baseline_models import BASELINES

            p.add_argument("--method", required=True, choices=BASELINES)
            p.add_argument("--repository", help="model repository to write into (default: export.repository)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    warnings.filterwarnings("ignore", message=".*torch.jit.*deprecated.*", category=FutureWarning)
    cfg = load_config(args.config, _overrides(args.set))
    resume = not args.no_resume
    if args.command in ("fit-backbone", "all"):
        from training.fit_backbone import fit_backbone

        fit_backbone(cfg, resume=resume)
    if args.command in ("distil", "all"):
        from training.distil import distil

        distil(cfg, resume=resume)
    if args.command in ("export", "all"):
        from training.export import export

        export(cfg)
    if args.command == "evaluate":
        from training.evaluate import evaluate

        evaluate(cfg, "python -m training " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:])))
    if args.command == "export-baseline":
        from training.baselines import export_baseline

        export_baseline(cfg, args.method, args.repository)
    return 0
