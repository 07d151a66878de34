"""The package arrows of docs/architecture.md, read from the source: models imports neither training nor service,
training never imports service, service never imports timm, transformers or training, the artifact contract imports
none of them (nor torch), and the training stages import shared modules, never each other's entry points."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN = {
    "models": {"training", "service"},
    "training": {"service"},
    "service": {"training", "timm", "transformers"},
    "artifact": {"models", "training", "service", "torch", "timm", "transformers"},
}
# each stage's entry point; a stage's sub-package may hold shared pieces other stages import (export.calibration)
STAGES = {"training.fit.backbone", "training.distil.stage", "training.export.stage", "training.evaluate.stage",
          "training.baselines.export"}
# modules whose job is to run stages: the CLI, calibrate, the ablation variants (distillations) and the ensemble
# members (fits)
ORCHESTRATORS = {"training.cli", "training.calibrate.stage", "training.evaluate.ablations", "training.baselines.models"}


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports (absolute names), wherever in the file the import sits."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_packages_import_only_along_the_arrows(package: str) -> None:
    bad = {f"{path.relative_to(ROOT)}: {name}" for path in sorted((ROOT / package).rglob("*.py"))
           for name in imported_modules(path) if name.split(".")[0] in FORBIDDEN[package]}
    assert not bad, sorted(bad)


def test_training_stages_do_not_import_each_other() -> None:
    bad = []
    for path in sorted((ROOT / "training").rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        others = (imported_modules(path) & STAGES) - {module}
        if module not in ORCHESTRATORS and others:
            bad.append(f"{module}: {sorted(others)}")
    assert not bad, bad
