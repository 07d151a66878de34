"""The one inference device of this process, its lock and its autocast policy."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch


@dataclass
class Device:
    """Forwards on one device are serialised by ``lock``: they would only compete for the same cores or
    SMs, and a seeded request needs the global RNG to itself for the length of its forward."""

    torch_device: torch.device
    bf16: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def is_cuda(self) -> bool:
        return self.torch_device.type == "cuda"

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        if self.bf16 and self.is_cuda:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                yield
        else:
            yield

    def memory_allocated(self) -> int | None:
        return int(torch.cuda.memory_allocated(self.torch_device)) if self.is_cuda else None


def resolve_device(name: str, bf16: bool, torch_threads: int) -> Device:
    if torch_threads > 0:
        torch.set_num_threads(torch_threads)
    if name == "cuda" or (name == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise RuntimeError("DIRECTOR_DEVICE=cuda but CUDA is not available")
        return Device(torch.device("cuda"), bf16=bf16)
    return Device(torch.device("cpu"), bf16=False)
