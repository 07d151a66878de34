"""Writing model-repository artifacts (docs/architecture.md): TorchScript files and the manifest."""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import subprocess
import warnings
from pathlib import Path
from typing import Any

import torch

from artifact.contract import ARTIFACT, MANIFEST, Manifest, retired_folder, sha256_file, staging_folder
from models.half_storage import drop_weight_caches
from training.data.images import ForwardArgs
from training.posthoc.ood_selection import returns_input_scores


def script_module(module: torch.nn.Module) -> torch.jit.ScriptModule:
    """``torch.jit.script`` with its deprecation warning silenced on purpose: TorchScript is the artifact
    format the product promises; a ``torch.export`` artifact can sit beside it later. Half-stored layers' weight
    caches are emptied first, so what an earlier forward cached is not saved with the file."""
    drop_weight_caches(module)
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
    """HEAD, with ``-dirty`` when tracked files differ from it. Untracked files do not count: the stages write
    their own outputs (new model versions, result pages) into the tree while they run."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True, timeout=5)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, timeout=5).stdout
        return out.stdout.strip() + ("-dirty" if dirty.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def source_record(source: str | None) -> dict[str, str] | None:
    """Where a run's checkpoint or data came from, as given, with a sha256 that identifies its content wherever it is
    later moved: a file's own digest, a folder's over the relative names and digests of all its files (a hub id or a
    built-in data set name records no digest)."""
    if source is None:
        return None
    path = Path(source)
    if path.is_file():
        return {"source": source, "sha256": sha256_file(path)}
    if not path.is_dir():
        return {"source": source}
    digest = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        digest.update(f"{file.relative_to(path).as_posix()}\0{sha256_file(file)}\n".encode())
    return {"source": source, "sha256": digest.hexdigest()}


def json_safe(value: Any) -> Any:
    """``value`` with non-finite floats replaced by None: strict JSON has no NaN (e.g. an AUROC of a split
    without errors), and clients such as browsers and FastAPI's encoder reject it."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def write_manifest(directory: Path, manifest: Manifest) -> Path:
    path = directory / MANIFEST
    path.write_text(json.dumps(json_safe(manifest.document()), indent=2, allow_nan=False) + "\n")
    return path


def staging_dir(out_dir: Path) -> Path:
    """An empty staging folder (``artifact.contract.staging_folder``) for ``install_version`` to swap in."""
    tmp_dir = staging_folder(out_dir)
    shutil.rmtree(tmp_dir, ignore_errors=True)
    tmp_dir.mkdir(parents=True)
    return tmp_dir


def install_version(tmp_dir: Path, out_dir: Path) -> None:
    """Swap a staged version in with two renames: a polling server sees it missing for microseconds at most."""
    if out_dir.exists():
        retired = retired_folder(out_dir)
        shutil.rmtree(retired, ignore_errors=True)
        out_dir.rename(retired)
        tmp_dir.rename(out_dir)
        shutil.rmtree(retired)
    else:
        tmp_dir.rename(out_dir)


def script_and_verify(artifact_module: torch.nn.Module, eager: torch.nn.Module, probe: ForwardArgs, path: Path,
                      n_samples: int = 4) -> torch.jit.ScriptModule:
    """Script ``artifact_module`` to ``path``, load it back and check it matches ``eager`` under one seed on the
    model inputs ``probe`` ((pixels,) or (ids, mask))."""
    save_scripted(script_module(artifact_module), path)
    served = load_scripted(path)
    torch.manual_seed(0)
    eager_out = eager(*probe, n_samples)
    torch.manual_seed(0)
    served_out = served(*probe, n_samples)
    if not torch.allclose(eager_out, served_out, atol=1e-4):
        raise RuntimeError(f"scripted artifact differs from the eager module by {(eager_out - served_out).abs().max()}")
    if returns_input_scores(artifact_module):  # the kernel error, from the artifact's own teacher layers
        ones = torch.ones(probe[0].shape[0], dtype=torch.long)  # [b]
        eager_error = artifact_module.scored_rows(*probe, ones)[1]  # [b, F]
        served_error = served.scored_rows(*probe, ones)[1]  # [b, F]
        if not torch.allclose(eager_error, served_error, rtol=1e-3, atol=1e-7):
            raise RuntimeError("the scripted artifact's per-input scores differ from the eager module's")
    return served


PATH_FILES = {"posthoc": "posthoc.ts", "hybrid": "hybrid.ts"}  # the other paths' scripted modules, in the run folder


def script_path(method: str, module: torch.nn.Module, probe: ForwardArgs, run_dir: Path) -> torch.jit.ScriptModule:
    """The post-hoc path's or the hybrid's module scripted and verified into the run folder (``PATH_FILES``), where
    ``serve_path`` takes it from when the version serves it."""
    return script_and_verify(module, module, probe, run_dir / PATH_FILES[method])


def serve_path(run_dir: Path, method: str, tmp_dir: Path) -> None:
    """Put the served path's scripted file in the staged version: when ``method`` is the post-hoc path or the hybrid,
    its file from the run folder (``PATH_FILES``) replaces DIRECTOR's, which is kept in the run folder under the
    artifact's name."""
    if method in PATH_FILES:
        shutil.copyfile(tmp_dir / ARTIFACT, run_dir / ARTIFACT)
        shutil.copyfile(run_dir / PATH_FILES[method], tmp_dir / ARTIFACT)
