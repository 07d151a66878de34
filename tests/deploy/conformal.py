"""A conformal part for a copy of the committed default model, which was exported before versions carried one: the
monitoring stack then serves ``coverage`` and ``max_risk``, so the live coverage and selective risk queries of the
dashboard and alerts have data. The calibration split is synthetic (probabilities of a calibrated ten-class model,
labels drawn from them): the stack checks that every query returns data, not the guarantee itself, which
tests/service/test_decisions.py and tests/models check on a real calibration."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from artifact.contract import MANIFEST
from tests.service.conftest import rehash
from training.posthoc.conformal import write_conformal

CALIBRATION_INPUTS = 2000


def with_conformal(folder: Path, seed: int = 0) -> None:
    """Write ``conformal.json`` into the version ``folder`` and its section into the manifest, re-hashed."""
    generator = torch.Generator().manual_seed(seed)
    manifest = json.loads((folder / MANIFEST).read_text())
    classes = len(manifest["labels"])
    probs = torch.softmax(4.0 * torch.randn(CALIBRATION_INPUTS, classes, generator=generator, dtype=torch.float64), 1)
    labels = torch.multinomial(probs, 1, generator=generator).squeeze(1)  # calibrated by construction
    section = write_conformal(probs, labels, ["aps", "lac"], "aps", 0.0, 0, 0.1, "synthetic, for the monitoring test",
                              folder)
    manifest["conformal"] = section.model_dump(mode="json")
    manifest["files"][section.file] = {}
    rehash(folder, manifest)
