"""The artifact contract shared by the exporter (``training``) and the server (``service``): file names,
the manifest format version and sha256 verification. It lives here because ``models`` is the one
package both sides may import (DESIGN.md section 3)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

FORMAT_VERSION = "1.0"
MANIFEST = "manifest.json"
ARTIFACT = "director.ts"
TOKENIZER = "tokenizer.json"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify_files(directory: Path, manifest: dict[str, Any]) -> list[str]:
    """Names of the manifest's files that are missing or whose sha256 differs."""
    bad = []
    for name, entry in manifest.get("files", {}).items():
        path = directory / name
        if not path.is_file() or sha256_file(path) != entry["sha256"]:
            bad.append(name)
    return bad


def major_version(manifest: dict[str, Any]) -> int:
    return int(str(manifest.get("format_version", "0")).split(".")[0])
