"""Provenance: the commit a stage records is dirty only when tracked files differ from it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from training.posthoc.writing import git_commit


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout.strip()


def test_outputs_written_into_the_tree_do_not_make_it_dirty(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    git(tmp_path, "init", "-q")
    (tmp_path / "code.py").write_text("x = 1\n")
    git(tmp_path, "add", "code.py")
    git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    head = git(tmp_path, "rev-parse", "HEAD")
    monkeypatch.chdir(tmp_path)
    assert git_commit() == head
    (tmp_path / "model_repository").mkdir()
    (tmp_path / "model_repository" / "manifest.json").write_text("{}")  # a stage's own output, untracked
    assert git_commit() == head
    (tmp_path / "code.py").write_text("x = 2\n")  # the code that ran is not the commit's
    assert git_commit() == f"{head}-dirty"
