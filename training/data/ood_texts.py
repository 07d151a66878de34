"""Offline out-of-distribution text beyond the fortunes quotes, from files every Debian machine with Python has:

- software-licence sentences (``/usr/share/common-licenses``, package ``base-files``): the OOD *validation* set that
  picks the served score. Legal prose shares no topic with movie reviews, yet is fluent English, so the scores
  separate on it (word-shuffled training sentences, the set used before, gave every score an AUROC of ~0.46).
- Python standard-library docstrings: a second reported OOD set (technical English), beside the fortunes quotes.
- two more OOD-validation families, so the served score is chosen on more than one kind of input
  (``training.data.ood_families``): the installed Debian packages' changelog entries and lines of Python
  standard-library source code.
"""

from __future__ import annotations

import ast
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


CHANGELOGS = Path("/usr/share/doc")
SOURCE_MODULES = ("argparse", "csv", "json.decoder", "logging", "pathlib", "shutil", "statistics", "textwrap",
                  "zipfile")


def load_changelog_entries(root: str | Path = CHANGELOGS, min_words: int = 5) -> list[str]:
    """The change entries (``  * ...`` lines) of the installed Debian packages' changelogs
    (``<root>/*/changelog.Debian.gz``), at least ``min_words`` words each, de-duplicated in file order: terse
    maintainers' notes about software. Not the package descriptions, which the text model's distillation reads
    (``training.data.unlabeled``). Empty where the documentation was left out (slim images)."""
    import gzip

    seen: dict[str, None] = {}
    for path in sorted(Path(root).glob("*/changelog.Debian.gz")):
        with gzip.open(path, "rt", errors="replace") as handle:
            for line in handle:
                if line.startswith("  * ") and len(line.split()) - 1 >= min_words:
                    seen.setdefault(" ".join(line[4:].split()), None)
    return list(seen)


def load_source_code_lines(modules: tuple[str, ...] = SOURCE_MODULES, min_words: int = 5) -> list[str]:
    """Lines of Python standard-library source code with at least ``min_words`` whitespace-separated words, without
    comments and string statements (docstrings: the reported docstring set must share nothing with it): text that is
    not prose at all."""
    seen: dict[str, None] = {}
    for name in modules:
        source = inspect.getsource(importlib.import_module(name))
        strings = {line for node in ast.walk(ast.parse(source))
                   if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
                   for line in range(node.lineno, (node.end_lineno or node.lineno) + 1)}
        for number, line in enumerate(source.splitlines(), start=1):
            code = line.strip()
            if number not in strings and code and not code.startswith("#") and len(code.split()) >= min_words:
                seen.setdefault(code, None)
    return list(seen)
