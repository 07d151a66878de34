"""One module per input modality, chosen when an artifact loads (``modality_for``): each builds the model's
``InputDecoder`` and ``BatchRunner`` (``service.engine.modalities.base``). A new modality is a new module here and one
entry in ``MODALITIES``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from artifact.contract import Manifest
from service.engine.modalities import image, text
from service.engine.modalities.base import Modality

MODALITIES: dict[str, Callable[[Manifest, Path], Modality]] = {"image": image.load, "text": text.load}


def modality_for(manifest: Manifest, folder: Path) -> Modality:
    """The decoder and runner of the artifact in ``folder``; ``ValueError`` with a readable reason when they cannot be
    built."""
    load = MODALITIES.get(manifest.modality)
    if load is None:
        raise ValueError(f"modality {manifest.modality!r} is not one this server decodes: {', '.join(MODALITIES)}")
    return load(manifest, folder)
