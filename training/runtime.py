"""Process-level setup shared by the pipeline stages: seeds, threads, device, distributed ranks,
the learning-rate schedule and checkpoint files."""

from __future__ import annotations

import math
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed() -> DistInfo:
    """Join the process group when launched by torchrun (WORLD_SIZE > 1); gloo on CPU, nccl on GPU."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return DistInfo()
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
    return DistInfo(rank=dist.get_rank(), world_size=dist.get_world_size())


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def select_device(name: str, dist_info: DistInfo | None = None) -> torch.device:
    if name == "auto":
        if torch.cuda.is_available():
            local = int(os.environ.get("LOCAL_RANK", "0"))
            return torch.device(f"cuda:{local}")
        return torch.device("cpu")
    return torch.device(name)


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


def load_checkpoint(path: Path) -> dict[str, Any]:
    return torch.load(path, map_location="cpu", weights_only=False)
