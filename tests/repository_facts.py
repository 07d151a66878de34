"""The default model of `make serve` and its default version, read from the repository: one fact, one place.

`make serve` runs `python -m service`; with no model flag in its recipe, the model a request gets when it names none
is the settings' own default (``Settings.default_model``), and a request that names no version gets that model's
highest ready version: the highest version folder holding a manifest. Tests that mean "the default" read these
functions, so exporting a new default changes no test by hand. Tests that need a small whole-stack DIRECTOR artifact
(a kernel error, a ``scored_rows`` of the kernel error alone, S = 16 by default) name ``WHOLE_STACK_DIRECTOR_DIR``
instead: a new default, which may serve another path, never changes what they test."""

from __future__ import annotations

import functools
import re
from pathlib import Path

from artifact.contract import MANIFEST

REPO_ROOT = Path(__file__).resolve().parents[1]
MODEL_REPOSITORY = REPO_ROOT / "model_repository"
MAKEFILE = REPO_ROOT / "Makefile"
# fashion-vit v1: the first export, whole-stack DIRECTOR scored by energy; once the default, now kept for rollback
WHOLE_STACK_DIRECTOR_DIR = MODEL_REPOSITORY / "fashion-vit" / "1"

_DEFAULT_MODEL_OVERRIDE = re.compile(r"(?:--default[-_]model[= ]|DIRECTOR_DEFAULT_MODEL=)['\"]?([\w.-]+)")


def serve_recipe() -> str:
    """The command lines of the Makefile's ``serve`` target, joined (recipe lines start with a tab)."""
    lines = MAKEFILE.read_text().splitlines()
    start = next((i for i, line in enumerate(lines) if re.match(r"serve\s*:", line)), None)
    assert start is not None, f"{MAKEFILE} has no serve target"
    recipe = []
    for line in lines[start + 1:]:
        if not line.startswith("\t"):
            break
        recipe.append(line.strip())
    assert any("-m service" in line for line in recipe), f"make serve no longer runs `python -m service`: {recipe}"
    return "\n".join(recipe)


@functools.cache
def default_model() -> str:
    """The model `make serve` answers a request with when the request names none: the recipe's own override, if it
    passes one, else ``Settings.default_model``'s default (what ``python -m service`` uses)."""
    override = _DEFAULT_MODEL_OVERRIDE.search(serve_recipe())
    if override:
        return override.group(1)
    from service.config import Settings

    default = Settings.model_fields["default_model"].default
    assert isinstance(default, str) and default, default
    return default


def published_versions(model: str) -> list[int]:
    """The model's published version folders, ascending: numeric names holding a manifest (an export still being
    written sits in a hidden ``.N.tmp`` folder and is not one)."""
    folder = MODEL_REPOSITORY / model
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit() and (p / MANIFEST).is_file())


def default_version(model: str | None = None) -> str:
    """The version a request naming ``model`` (the default model when None) and no version is served: its highest
    published version. (A model's ``config.yaml`` could narrow the versions served; no committed model has one.)"""
    name = model or default_model()
    assert not (MODEL_REPOSITORY / name / "config.yaml").exists(), f"{name} has a config.yaml: read its version_policy"
    versions = published_versions(name)
    assert versions, f"no published version of {name} under {MODEL_REPOSITORY}"
    return str(versions[-1])


def default_version_dir(model: str | None = None) -> Path:
    """The folder of ``default_version(model)``."""
    return MODEL_REPOSITORY / (model or default_model()) / default_version(model)
