"""The torch.export artifact for a version exported without one: rebuild the eager artifact module from the run (as
the export built it, with the version's noise temperature and token correlation), compile it
(``training.export.torch_export``), verify the package against the version's own director.ts under one seed, and
write a copy of the version that serves it (``artifact.format: aoti``, the package in ``files``). The version
itself is not touched: the copy is what ``benchmarks/export_ab.py`` measures against it.

    python -m training.export.torch_export_version --config configs/fashion_vit.yaml \\
        --version model_repository/fashion-vit/6 --out /tmp/fashion-vit-aoti/6

``--set`` overrides the config as the pipeline's commands do (``--set run_dir=DIR`` for a run kept elsewhere), and
``--device cuda`` compiles the package for the GPU the version is then served on.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from artifact.contract import ARTIFACT, MANIFEST, file_digests, parse_manifest, read_document
from training.config import load_config, set_overrides
from training.export.torch_export import write_compiled
from training.loading import RunBackbone
from training.posthoc.feature_statistics import keep_scores
from training.posthoc.modality_parts import export_parts
from training.posthoc.writing import json_safe, load_scripted
from training.runtime import set_threads


def compile_beside(config: Path, version: Path, out: Path, device: str = "cpu",
                   overrides: dict[str, Any] | None = None) -> dict[str, object]:
    """Write ``out``: ``version``'s files, its package for ``device`` ("cpu", or "cuda": written for a GPU host, not
    run on one yet) and its manifest naming the package; returns the manifest's ``artifact`` entries that name it."""
    cfg = load_config(config, overrides)
    manifest = parse_manifest(read_document(version))
    opened = RunBackbone.open(cfg.run_dir)  # backbone.pt read once
    director, _ = opened.director()
    parts = export_parts(cfg, opened.family, opened.backbone)
    director.rollout.noise_scale.fill_(manifest.sampling.noise_scale or 1.0)
    director.rollout.set_token_correlation(manifest.sampling.token_correlation or 0.0)
    with tempfile.TemporaryDirectory() as scratch:
        module, _ = parts.build_artifact(director, Path(scratch) / ARTIFACT)  # the eager module the export scripted
    if manifest.artifact is not None and manifest.artifact.input_scores:
        keep_scores(module, manifest.artifact.input_scores)  # the columns the version's own file returns
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(version, out)
    # verified against the version's own file: the package serves what director.ts serves
    served = load_scripted(version / ARTIFACT).to(device)
    probe = tuple(tensor.to(device) for tensor in parts.data.val.first_args(8))
    info = write_compiled(module.to(device), served, probe, out)
    document = manifest.document()
    document["artifact"] = {**document.get("artifact", {}), **info}
    document["files"] = {name: entry.document() for name, entry in file_digests(out).items()}
    (out / MANIFEST).write_text(json.dumps(json_safe(document), indent=2) + "\n")
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, required=True, help="the training config of the version's run")
    parser.add_argument("--version", type=Path, required=True, help="the version folder (director.ts, manifest)")
    parser.add_argument("--out", type=Path, required=True, help="where the copy serving the package is written")
    parser.add_argument("--device", default="cpu", help="the device the package is compiled for (cpu, cuda)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config value, e.g. --set run_dir=/tmp/run (the run the version came from)")
    args = parser.parse_args(argv)
    set_threads(args.threads)
    torch.manual_seed(0)
    info = compile_beside(args.config, args.version, args.out, args.device, set_overrides(args.set))
    print(f"wrote {args.out}: {json.dumps(info)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
