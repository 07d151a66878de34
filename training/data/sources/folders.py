"""Folder listings as the loaders read them: sorted, without what file managers and zip tools leave behind."""

from __future__ import annotations

from pathlib import Path

from training.data.sources.errors import DataError

HIDDEN_NAMES = {"Thumbs.db", "desktop.ini", "__MACOSX"}  # written by file managers and zip tools, never data


def _hidden(path: Path) -> bool:
    return path.name.startswith(".") or path.name in HIDDEN_NAMES


def entries(folder: Path) -> list[Path]:
    """The folder's entries in name order (so that every run reads the same), hidden ones left out."""
    try:
        return sorted(p for p in folder.iterdir() if not _hidden(p))
    except OSError as exc:
        raise DataError(f"cannot list the folder {folder}: {exc.strerror or exc}") from exc
