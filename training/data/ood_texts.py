"""Offline out-of-distribution text beyond the fortunes quotes, from files every Debian machine with Python has:

- software-licence sentences (``/usr/share/common-licenses``, package ``base-files``): the OOD *validation* set that
  picks the served score. Legal prose shares no topic with movie reviews, yet is fluent English, so the scores
  separate on it (word-shuffled training sentences, the set used before, gave every score an AUROC of ~0.46).
- Python standard-library docstrings: a second reported OOD set (technical English), beside the fortunes quotes.
"""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

LICENSES_DIR = Path("/usr/share/common-licenses")
DOCSTRING_MODULES = (
    "argparse", "asyncio", "calendar", "collections", "csv", "datetime", "decimal", "email", "fractions", "functools",
    "gzip", "heapq", "http.client", "itertools", "json", "logging", "os", "pathlib", "random", "re", "shutil",
    "socket", "sqlite3", "statistics", "string", "subprocess", "tarfile", "textwrap", "threading", "unittest",
    "urllib.request", "uuid", "zipfile",
)


def sentences(text: str, min_words: int = 5, max_words: int = 60) -> list[str]:
    """Whitespace-collapsed sentences of ``text`` (split after . ! ?) with ``min_words``..``max_words`` words."""
    flat = " ".join(text.split())
    return [s for s in re.split(r"(?<=[.!?])\s+", flat) if min_words <= len(s.split()) <= max_words]


def load_license_sentences(root: str | Path = LICENSES_DIR) -> list[str]:
    """Sentences of the licence texts in ``root``, de-duplicated in file order."""
    files = sorted(p for p in Path(root).glob("*") if p.is_file()) if Path(root).is_dir() else []
    if not files:
        raise FileNotFoundError(f"no licence texts in {root} (Debian package base-files)")
    seen: dict[str, None] = {}
    for path in files:
        for sentence in sentences(path.read_text(errors="replace")):
            seen.setdefault(sentence, None)
    return list(seen)


def load_docstring_sentences(modules: tuple[str, ...] = DOCSTRING_MODULES) -> list[str]:
    """Sentences of the docstrings of some standard-library modules and their public functions and classes."""
    seen: dict[str, None] = {}
    for name in modules:
        module = importlib.import_module(name)
        objects = [module] + [obj for attr, obj in sorted(vars(module).items())
                              if not attr.startswith("_") and (inspect.isfunction(obj) or inspect.isclass(obj))]
        for obj in objects:
            for sentence in sentences(inspect.getdoc(obj) or ""):
                seen.setdefault(sentence, None)
    return list(seen)
