"""benchmarks/export_ab.py's measure of the interpreter lock: how much Python another thread gets done while a
format's forwards run."""

from __future__ import annotations

import time
from types import ModuleType
from typing import Any

import pytest
import torch

from tests.benchmarks.test_gpu_check import BENCHMARKS, load


class Releases:
    """A forward that waits outside the interpreter (as a TorchScript method does while its graph runs)."""

    def sample_rows(self, pixels: torch.Tensor, repeats: torch.Tensor) -> Any:
        time.sleep(0.002)


class Holds:
    """A forward that keeps the interpreter lock in C code throughout (as AOTInductor's runner does in torch 2.14)."""

    def sample_rows(self, pixels: torch.Tensor, repeats: torch.Tensor) -> Any:
        return sum(range(3_000_000))


@pytest.fixture
def export_ab(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # its sibling imports are a script's
    return load("export_ab")


def test_python_progress_tells_a_forward_that_holds_the_lock_from_one_that_releases_it(export_ab: ModuleType) -> None:
    progress = export_ab.python_progress({"releases": Releases(), "holds": Holds()}, "sample_rows",
                                         lambda batch: (torch.rand(batch, 1, 4, 4),), torch.device("cpu"), seconds=0.5)
    assert set(progress) == {"releases", "holds"}
    assert progress["releases"] > 0.5 and progress["releases"] > 2 * progress["holds"], progress
