"""Input codecs, one per modality, chosen when an artifact loads (``codec_for``): a new modality is a new module
here and one entry in ``CODECS``."""

from __future__ import annotations

from pathlib import Path

from artifact.contract import Manifest
from service.engine.codecs.base import Codec
from service.engine.codecs.image import ImageCodec
from service.engine.codecs.text import TextCodec

CODECS: dict[str, type[Codec]] = {codec.modality: codec for codec in (ImageCodec, TextCodec)}


def codec_for(manifest: Manifest, folder: Path) -> Codec:
    """The codec of the artifact in ``folder``; ``ValueError`` with a readable reason when it cannot be built."""
    codec = CODECS.get(manifest.modality)
    if codec is None:
        raise ValueError(f"modality {manifest.modality!r} is not one this server decodes: {', '.join(CODECS)}")
    return codec.load(manifest, folder)
