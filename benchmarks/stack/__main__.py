"""``python -m benchmarks.stack [--work /var/tmp/director-stack] [--rebuild] [--keep-images]``: the stack run for real.

1. Starts a private Docker engine (data root under ``--work``), builds the base images from Debian packages and the
   project's serving and training images from docker/Dockerfile (on the local PyTorch image, ``TORCH_IMAGE``).
2. Brings the compose stack up as a CPU host runs it (``-f docker/compose.cpu.yml --profile cpu``): the server,
   PostgreSQL, Prometheus and Alertmanager; Grafana stays off (its server is in no registry reachable here).
3. Checks it: healthchecks, ``/predict`` and OIP on the published port, Prometheus's target, an OOD alert delivered
   by Alertmanager, feedback rows in PostgreSQL across a server restart, a training run published under traffic,
   and a SIGTERM drain.
4. Takes the stack down with its volumes, stops the engine, reports its disk usage and, unless ``--keep-images``,
   deletes its data root.

Writes docs/compose-stack.json and docs/compose-stack.md; exits 1 when a check failed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.server import ROOT
from benchmarks.stack import checks
from benchmarks.stack.compose import RULE_WAIT, Stack
from benchmarks.stack.daemon import folder_bytes, private_engine
from benchmarks.stack.images import local_images, project_images
from benchmarks.stack.report import write_markdown


def run(args: argparse.Namespace) -> dict[str, object]:
    work: Path = args.work
    work.mkdir(parents=True, exist_ok=True)
    data_root = work / "docker"
    started = time.monotonic()
    results: dict[str, object] = {"date": time.strftime("%Y-%m-%d"), "rule_wait": RULE_WAIT}
    with private_engine(data_root, work / "dockerd.log") as docker:
        print("building the local base images ...", flush=True)
        local = local_images(docker, work, args.rebuild)
        print("building the serving and training images ...", flush=True)
        project = project_images(docker, local["torch"].tag, rebuild=True)
        results["images"] = {name: vars(built) for name, built in {**local, **project}.items()}
        stack = Stack(docker, work / "run", local["torch"].tag)
        found: list[checks.Check] = []
        try:
            with checks.receiving(stack.webhook_port) as receiver:
                found.append(checks.serving_image_contents(docker))
                for step in (checks.cold_start, checks.predict_and_oip, checks.prometheus_target):
                    print(f"check: {step.__name__} ...", flush=True)
                    found.append(step(stack))
                print("check: ood_alert ...", flush=True)
                found.append(checks.ood_alert(stack, receiver))
                for step in (checks.feedback_survives_restart, checks.training_publishes, checks.sigterm_drains):
                    print(f"check: {step.__name__} ...", flush=True)
                    found.append(step(stack))
        finally:
            results["left_behind"] = stack.down()
            results["engine_disk_bytes"] = folder_bytes(data_root)
        left = results["left_behind"]
        found.append(checks.Check("down leaves no container, volume or network", not any(left.values()),
                                  {kind: len(ids) for kind, ids in left.items()}))
        results["checks"] = [vars(c) for c in found]
    engines = subprocess.run(["pgrep", "-f", f"dockerd --data-root {data_root}"], capture_output=True, text=True)
    results["engine_left_running"] = engines.returncode == 0
    if not args.keep_images:  # the images, and what built them (the torch wheels, 2.9 GB)
        for name in ("docker", "wheels", "torch-context", "rootfs"):
            shutil.rmtree(work / name, ignore_errors=True)
    results["engine_disk_bytes_after"] = folder_bytes(work)
    results["total_s"] = round(time.monotonic() - started, 1)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=Path("/var/tmp/director-stack"),
                        help="the engine's data root and the run's files (about 25 GB while it runs)")
    parser.add_argument("--rebuild", action="store_true", help="rebuild the local base images even when cached")
    parser.add_argument("--keep-images", action="store_true",
                        help="keep the engine's data root (the images) and the torch wheels for the next run")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "compose-stack.json")
    args = parser.parse_args(argv)
    results = run(args)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    write_markdown(results, args.out.with_suffix(".md"))
    failed = [c["name"] for c in results["checks"] if not c["passed"]]
    if results["engine_left_running"]:
        failed.append("the private engine stopped")
    print(json.dumps({"passed": len(results["checks"]) - len(failed), "failed": failed,
                      "total_s": results["total_s"]}, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
