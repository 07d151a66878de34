"""The depth search of ``python -m training calibrate``: which K (the last K transitions diffused) to export.

Each candidate is distilled in its own sub-run (``runs/NAME/depth-K/``). With ``distil.probe_epochs`` (default 1) and
more than one candidate, every candidate is first distilled that many epochs (a probe) and only the one with the best
validation NLL then goes on to ``distil.epochs``: its probe is the start of that run (the schedule spans every epoch
from the first), so nothing is trained twice. Why a probe and not every depth to the end: docs/your-own-model.md,
"Choosing K". ``probe_epochs: null`` distils every candidate to the end. The step statistics of the teacher are
gathered once for the run and shared by every depth (``training.distil.teacher.shared_statistics``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from training.calibrate.plan import epochs
from training.calibrate.run_config import CONFIG_FILE
from training.config import PipelineConfig, config_dict
from training.distil.stage import Distillation, distil
from training.distil.teacher import STATISTICS_FILE
from training.loading import BACKBONE_FILE, DIRECTOR_FILE
from training.runtime import load_checkpoint

SELECTION_FILE = "depth_selection.json"
DISTIL_CONFIG_FILE = "distil.yaml"  # a depth's sub-run config, for torchrun
SHARED_FILES = (BACKBONE_FILE, "tokenizer.json", "images")  # what every depth's sub-run reads from the run


class DistillationFailed(ValueError):
    """A depth's distillation under torchrun failed; the message says how to rerun it."""


def depth_config(cfg: PipelineConfig, depth: int) -> PipelineConfig:
    """The sub-run that distils depth K: its own folder beside the run's shared backbone and tokenizer, and a link
    to the run's step statistics (written by the first depth that gathers them)."""
    run_dir = Path(cfg.run_dir) / f"depth-{depth}"
    run_dir.mkdir(parents=True, exist_ok=True)
    for name in (*SHARED_FILES, STATISTICS_FILE):
        link, target = run_dir / name, Path(cfg.run_dir) / name
        if (target.exists() or name == STATISTICS_FILE) and not os.path.lexists(link):
            os.symlink(os.path.relpath(target, run_dir), link)
    sub = replace(cfg, run_dir=str(run_dir), distil=replace(cfg.distil, depth=depth))
    return replace(sub, source=str(Path(cfg.run_dir) / CONFIG_FILE))


def epochs_trained(run_dir: Path) -> int:
    """The epochs a sub-run's ``director.pt`` was distilled for (0: none written yet)."""
    path = run_dir / DIRECTOR_FILE
    if not path.exists():
        return 0
    payload = load_checkpoint(path)
    if payload.get("finished"):  # every epoch, or the step budget (distil.max_steps) spent
        return max(int(payload["config"]["distil"]["epochs"]), int(payload["epochs_trained"]))
    return int(payload.get("epochs_trained") or (payload["history"][-1]["epoch"] if payload["history"] else 0))


def validation_nll(run_dir: Path, by_epoch: int | None = None) -> float:
    """The validation NLL of the epoch a distillation kept, among its epochs up to ``by_epoch`` (None: all)."""
    payload = load_checkpoint(run_dir / DIRECTOR_FILE)
    history = [r for r in payload["history"] if by_epoch is None or r["epoch"] <= by_epoch]
    kept_best = payload.get("config", {}).get("distil", {}).get("keep_best", True)
    if by_epoch is None:
        records = [r for r in history if r["epoch"] == payload["kept_epoch"]] or history[-1:]
        return float(records[0]["val_nll"])
    return float(min(r["val_nll"] for r in history)) if kept_best else float(history[-1]["val_nll"])


def distil_under_torchrun(cfg: PipelineConfig, processes: int, resume: bool, until: int | None) -> None:
    """``distil`` of one depth's sub-run in ``processes`` DDP ranks (``torch.distributed.run``, one per GPU, or gloo
    on CPU): its config is written beside the sub-run, so the command can also be rerun by hand."""
    config = Path(cfg.run_dir) / DISTIL_CONFIG_FILE
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(yaml.safe_dump({k: v for k, v in config_dict(cfg).items() if k != "source"}, sort_keys=False))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}",
               "-m", "training", "distil", "--config", str(config), *([] if resume else ["--no-resume"]),
               *([] if until is None else ["--until-epoch", str(until)])]
    print("running " + " ".join(command), flush=True)
    if subprocess.run(command, check=False).returncode != 0:
        raise DistillationFailed(f"distillation under torchrun failed (see its output above); rerun it with: "
                                 f"{' '.join(command[2:])}")


@dataclass
class DepthSearch:
    """One calibrate run's depth search: the sub-run of each candidate, the probe (None: every candidate to the
    end), and how it distils (``processes`` DDP ranks when > 1)."""

    cfg: PipelineConfig
    subs: dict[int, PipelineConfig]  # K -> its sub-run (K = 0: the run itself, distil.depth alone)
    probe: int | None
    resume: bool
    processes: int = 1

    @property
    def epochs(self) -> int:
        return self.cfg.distil.epochs

    def trained(self, depth: int) -> int:
        return epochs_trained(Path(self.subs[depth].run_dir)) if self.resume else 0

    def distil(self, depth: int, until: int | None, run: Distillation | None = None,
               resume: bool | None = None) -> Distillation | None:
        """Distil ``depth`` to epoch ``until`` (None: the end), going on with ``run`` when one is in memory; the run
        to go on with later (None under torchrun, where each call is its own processes)."""
        resume = self.resume if resume is None else resume
        if self.processes > 1:
            distil_under_torchrun(self.subs[depth], self.processes, resume, until)
            return None
        return distil(self.subs[depth], resume=resume, until=until, run=run).run


def search_line(search: DepthSearch, to_run: list[int]) -> str:
    """What the depth search will do: the candidates, those it distils (probes first, when it probes) and those
    distilled before (resumed)."""
    candidates = list(search.subs)
    done = [k for k in candidates if k not in to_run]
    line = f"depth search: K in {candidates}, "
    if search.probe is not None:
        line += (f"each distilled {search.probe} of {search.epochs} epochs (a probe), then the best to the end; "
                 f"probing {len(to_run)}")
    else:
        line += f"distilling {len(to_run)}"
    line += f" (K in {to_run})" if to_run else ""
    return line + (f"; K in {done} distilled before, resumed" if done else "")


def probe_depths(search: DepthSearch) -> tuple[dict[int, float], dict[int, Distillation]]:
    """Every candidate distilled ``probe`` epochs (or read back when it was): validation NLL by K after the probe,
    and the run of the best so far kept in memory to go on with."""
    assert search.probe is not None
    to_run = [k for k in search.subs if search.trained(k) < search.probe]
    print(search_line(search, to_run), flush=True)
    scores: dict[int, float] = {}
    kept: dict[int, Distillation] = {}
    for depth in search.subs:
        if depth in to_run:
            print(f"depth {to_run.index(depth) + 1} of {len(to_run)}: probing K={depth} ({search.probe} of "
                  f"{search.epochs} epochs)", flush=True)
            run = search.distil(depth, search.probe)
        else:
            run = None
        scores[depth] = validation_nll(Path(search.subs[depth].run_dir), search.probe)
        print(f"depth K={depth}: validation NLL {scores[depth]:.4f} after {epochs(search.probe)}", flush=True)
        best = min(scores, key=lambda k: (round(scores[k], 4), k))
        kept = {best: kept[best]} if best in kept else {}
        if best == depth and run is not None:
            kept[depth] = run  # the runs of depths that lost are let go: one set of start states in memory
    return scores, kept


def choose_depth(cfg: PipelineConfig, resume: bool, processes: int = 1) -> PipelineConfig:
    """The depth search (the module docstring); returns the sub-run of the chosen K, distilled to the end (ties: the
    smaller K, the cheaper artifact), and writes ``SELECTION_FILE``."""
    subs = {depth: depth_config(cfg, depth) if depth else cfg
            for depth in cfg.distil.depth_candidates or [cfg.distil.depth or 0]}
    probe = cfg.distil.probe_epochs
    if len(subs) < 2 or probe is None or probe >= cfg.distil.epochs:
        probe = None
    elif probe < 1:
        raise ValueError(f"distil.probe_epochs must be at least 1 (or null: every depth to the end), got {probe}")
    search = DepthSearch(cfg, subs, probe, resume, processes)
    record: dict[str, object] = {"epochs": search.epochs, "probe_epochs": probe}
    if probe is None:
        to_run = [k for k in subs if search.trained(k) < search.epochs]
        print(search_line(search, to_run), flush=True)
        scores: dict[int, float] = {}
        for depth in subs:
            if depth in to_run:
                print(f"depth {to_run.index(depth) + 1} of {len(to_run)}: distilling K={depth}", flush=True)
                search.distil(depth, None)
            scores[depth] = validation_nll(Path(subs[depth].run_dir))
            print(f"depth K={depth}: validation NLL {scores[depth]:.4f}", flush=True)
        chosen = min(scores, key=lambda k: (round(scores[k], 4), k))
    else:
        probed, kept = probe_depths(search)
        chosen = min(probed, key=lambda k: (round(probed[k], 4), k))
        record["probe_validation_nll"] = {str(k): v for k, v in probed.items()}
        if epochs_trained(Path(subs[chosen].run_dir)) < search.epochs:
            print(f"chosen depth K={chosen} (the best validation NLL after the probe): distilling it to "
                  f"{search.epochs} epochs", flush=True)
            search.distil(chosen, None, kept.get(chosen), resume=True)  # on from its probe, whatever --no-resume said
        scores = {chosen: validation_nll(Path(subs[chosen].run_dir))}
        print(f"depth K={chosen}: validation NLL {scores[chosen]:.4f} after {search.epochs} epochs", flush=True)
    record.update({"validation_nll": {str(k): v for k, v in scores.items()}, "chosen": chosen})
    (Path(cfg.run_dir) / SELECTION_FILE).write_text(json.dumps(record, indent=2) + "\n")
    print(f"chosen depth K={chosen}", flush=True)
    return depth_config(cfg, chosen) if chosen else cfg
