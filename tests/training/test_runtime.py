"""Device and process-group choice of the training stages, on CPU: the distributed calls are recorded instead of
made (no GPU here; tests/gpu/ runs NCCL for real when two GPUs exist)."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

from training import runtime
from training.runtime import DistInfo, autocast, data_parallel, init_distributed, select_device


class FakeGroup:
    """Stands in for torch.distributed and torch.cuda.set_device: records what the runtime asked for."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, cuda_available: bool) -> None:
        self.calls: list[tuple[str, Any]] = []
        monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda_available)
        monkeypatch.setattr(torch.cuda, "set_device", lambda index: self.calls.append(("set_device", index)))
        monkeypatch.setattr(runtime.dist, "is_initialized", lambda: False)
        monkeypatch.setattr(runtime.dist, "init_process_group",
                            lambda backend: self.calls.append(("init_process_group", backend)))
        monkeypatch.setattr(runtime.dist, "get_rank", lambda: 1)
        monkeypatch.setattr(runtime.dist, "get_world_size", lambda: 2)
        monkeypatch.setenv("WORLD_SIZE", "2")
        monkeypatch.setenv("LOCAL_RANK", "1")


def test_cpu_training_uses_gloo_even_where_cuda_exists(monkeypatch: pytest.MonkeyPatch) -> None:
    group = FakeGroup(monkeypatch, cuda_available=True)
    info = init_distributed("cpu")
    assert group.calls == [("init_process_group", "gloo")]
    assert info == DistInfo(rank=1, world_size=2, local_rank=1)
    assert select_device("cpu", info) == torch.device("cpu")


def test_cuda_training_binds_the_rank_s_gpu_before_nccl(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("cuda", "auto"):
        group = FakeGroup(monkeypatch, cuda_available=True)
        info = init_distributed(name)
        assert group.calls == [("set_device", 1), ("init_process_group", "nccl")], name
        assert select_device(name, info) == torch.device("cuda:1")  # never every rank on GPU 0
    assert select_device("cuda:0", info) == torch.device("cuda:0")


def test_auto_without_cuda_is_gloo_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    group = FakeGroup(monkeypatch, cuda_available=False)
    info = init_distributed("auto")
    assert group.calls == [("init_process_group", "gloo")] and select_device("auto", info).type == "cpu"


def test_one_process_is_neither_distributed_nor_wrapped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    info = init_distributed("auto")
    module = torch.nn.Linear(2, 2)
    assert info == DistInfo() and data_parallel(module, torch.device("cpu"), info) is module


def test_bf16_autocast_only_on_cuda() -> None:
    with autocast(torch.device("cpu"), bf16=True):
        out = torch.nn.Linear(4, 4)(torch.ones(2, 4))  # [2, 4]
    assert out.dtype == torch.float32
    with warnings.catch_warnings():  # without CUDA torch warns that the autocast built here would be disabled
        warnings.simplefilter("ignore", UserWarning)
        assert isinstance(autocast(torch.device("cuda", 0), bf16=True), torch.autocast)
    assert not isinstance(autocast(torch.device("cuda", 0), bf16=False), torch.autocast)
