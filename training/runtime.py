"""Process-level setup shared by the pipeline stages: seeds, threads, device, distributed ranks,
the learning-rate schedule and checkpoint files."""

from __future__ import annotations

import contextlib
import math
import os
import pickle
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def uses_cuda(name: str) -> bool:
    """Whether the configured device ``name`` (``auto``, ``cpu``, ``cuda``, ``cuda:N``) trains on CUDA."""
    return name.startswith("cuda") or (name == "auto" and torch.cuda.is_available())


def init_distributed(device: str = "auto") -> DistInfo:
    """Join the process group when launched by torchrun (WORLD_SIZE > 1): NCCL when this run trains on CUDA, each
    rank bound to its own GPU (LOCAL_RANK) before the group forms; gloo otherwise, even on a host with CUDA."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return DistInfo()
    cuda = uses_cuda(device)
    if cuda:
        torch.cuda.set_device(local_rank())
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if cuda else "gloo")
    return DistInfo(rank=dist.get_rank(), world_size=dist.get_world_size(), local_rank=local_rank())


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def select_device(name: str, dist_info: DistInfo | None = None) -> torch.device:
    """``auto``: CUDA when available, else the CPU. ``auto`` and ``cuda`` on CUDA mean this rank's GPU
    (LOCAL_RANK), so torchrun ranks never share one; ``cuda:N`` is taken as given."""
    if name in ("auto", "cuda") and uses_cuda(name):
        return torch.device(f"cuda:{dist_info.local_rank if dist_info is not None else local_rank()}")
    if name == "auto":
        return torch.device("cpu")
    return torch.device(name)


def data_parallel(module: torch.nn.Module, device: torch.device, dist_info: DistInfo) -> torch.nn.Module:
    """``module`` as DDP when there are several ranks (on CUDA with its GPU as ``device_ids``), else itself."""
    if dist_info.world_size == 1:
        return module
    device_ids = [device.index if device.index is not None else 0] if device.type == "cuda" else None
    return DistributedDataParallel(module, device_ids=device_ids)


def autocast(device: torch.device, bf16: bool) -> contextlib.AbstractContextManager[object]:
    """bf16 autocast of the forward on CUDA when ``bf16`` is set; nothing otherwise (the CPU stays fp32)."""
    if bf16 and device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def set_threads(threads: int | None) -> None:
    if threads:
        torch.set_num_threads(threads)


def warmup_cosine(
    optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up then cosine decay to zero, per optimizer step."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / max(1, warmup_steps)
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def save_checkpoint(path: Path, payload: dict[str, Any]) -> None:
    """Write atomically so an interrupted run never leaves a half-written checkpoint."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save(payload, tmp)
    tmp.replace(path)


class CheckpointRefused(ValueError):
    """A run-folder file that is not plain tensors and containers: loading it could run code it carries."""


def load_checkpoint(path: Path) -> dict[str, Any]:
    """A run's own payload (tensors, numbers, strings and containers of them). ``weights_only``: a file in a run folder
    is data, never code, so a pickle that would build anything else (a planted ``backbone_ckpt.pt`` that runs a
    command on resume) is refused instead of executed (docs/operations.md, "Threat model")."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise CheckpointRefused(f"{path} holds more than weights and plain values, so it is not loaded (it could run "
                                f"code): {str(exc).splitlines()[0][:200]}") from exc


class StepProgress:
    """A stage's named steps, each printed as it starts ("export 4/7: the kernel's verdict"): a line per step
    stays readable in a log, where a bar of unnamed steps updated every few minutes says nothing."""

    def __init__(self, stage: str, steps: tuple[str, ...]) -> None:
        self.stage, self.steps, self.index = stage, steps, 0
        self._announce()

    def _announce(self) -> None:
        if self.index < len(self.steps):
            print(f"{self.stage} {self.index + 1}/{len(self.steps)}: {self.steps[self.index]}", flush=True)

    def done(self) -> None:
        """The current step finished; the next one starts."""
        self.index += 1
        self._announce()
