"""Writing model-repository artifacts (DESIGN.md section 4): TorchScript files and the manifest."""

from __future__ import annotations

import json
import subprocess
import warnings
from pathlib import Path
from typing import Any

import torch

from models.artifact_format import MANIFEST, sha256_file


def script_module(module: torch.nn.Module) -> torch.jit.ScriptModule:
    """``torch.jit.script`` with its deprecation warning silenced on purpose: TorchScript is the artifact
    format the product promises; a ``torch.export`` artifact can sit beside it later."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*torch.jit.*", category=FutureWarning)
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        return torch.jit.script(module)


def load_scripted(path: Path) -> torch.jit.ScriptModule:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*torch.jit.*", category=FutureWarning)
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        return torch.jit.load(str(path), map_location="cpu")


def save_scripted(module: torch.jit.ScriptModule, path: Path) -> None:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*torch.jit.*", category=FutureWarning)
        torch.jit.save(module, str(path))


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True, timeout=5)
        dirty = subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True, timeout=5).stdout
        return out.stdout.strip() + ("-dirty" if dirty.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def write_manifest(directory: Path, manifest: dict[str, Any]) -> Path:
    """Add the sha256 of every file in ``directory`` except the manifest, then write the manifest."""
    files = {p.name: {"sha256": sha256_file(p), "bytes": p.stat().st_size}
             for p in sorted(directory.iterdir()) if p.is_file() and p.name != MANIFEST}
    manifest = {**manifest, "files": files}
    path = directory / MANIFEST
    path.write_text(json.dumps(manifest, indent=2) + "\n")
    return path
