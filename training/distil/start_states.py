"""The diffusion's start states X_{T-K}, computed once per training input.

Partial depth: with depth K the first T - K transitions run as the real layers (the prefix) and only the last K are
diffused. The prefix is deterministic, so its output is computed once per input and an epoch costs only the K teacher
and kernel steps. The states are [N, L, D]: for a large backbone or data set more than memory holds, so past
``distil.start_states_memory_bytes`` they are written to a file in half precision and read back a batch at a time
(``SpilledStates``), and the process's memory no longer grows with the data set.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from training.data.images import key_padding
from training.loading import AnySplit, View

STATES_FILE = "start_states.f16"


class SpilledStates:
    """States [N, L, D] in float16 in a file; rows are written and read with ``os.pwrite`` / ``os.pread``, so they sit
    in the page cache the kernel manages (and drops under pressure), not in the process."""

    def __init__(self, path: Path, shape: tuple[int, int, int]) -> None:
        self.path, self.shape = path, shape
        self.row_bytes = shape[1] * shape[2] * 2
        path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        os.ftruncate(self.fd, shape[0] * self.row_bytes)

    def __setitem__(self, index: torch.Tensor, rows: torch.Tensor) -> None:
        """Rows ``index`` [b] <- ``rows`` [b, l, D] (l <= L: zero-padded to L)."""
        padded = torch.zeros(rows.shape[0], self.shape[1], self.shape[2], dtype=torch.float16)  # [b, L, D]
        padded[:, : rows.shape[1]] = rows
        for row, i in zip(padded.numpy(), index.tolist(), strict=True):
            os.pwrite(self.fd, row.tobytes(), i * self.row_bytes)

    def __getitem__(self, index: torch.Tensor) -> torch.Tensor:
        """Rows ``index`` [b] -> [b, L, D] float32."""
        out = np.empty((len(index), self.shape[1], self.shape[2]), dtype=np.float16)
        for j, i in enumerate(index.tolist()):
            out[j] = np.frombuffer(os.pread(self.fd, self.row_bytes, i * self.row_bytes), dtype=np.float16).reshape(
                self.shape[1:])
        return torch.from_numpy(out).float()

    def __del__(self) -> None:
        fd = getattr(self, "fd", None)
        if fd is not None:
            os.close(fd)


@dataclass
class StartStates:
    """X_{T-K} of every input (the prefix's output; X_0 when K = T): states [N, L, D] (a CPU tensor, or a file past
    the memory budget), the key padding mask [N, L] (True for real tokens; None for images) and the labels [N]."""

    states: torch.Tensor | SpilledStates
    mask: torch.Tensor | None
    labels: torch.Tensor

    @property
    def lengths(self) -> torch.Tensor:
        if self.mask is None:
            return torch.full((self.states.shape[0],), self.states.shape[1])
        return self.mask.sum(dim=1)  # [N]

    def __len__(self) -> int:
        return int(self.states.shape[0])

    @property
    def spilled(self) -> bool:
        return isinstance(self.states, SpilledStates)

    def rows(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """States [b, l, D] and mask [b, l] of rows ``index``, texts trimmed to the longest of them."""
        states = self.states[index]  # [b, L, D]
        if self.mask is None:
            return states, None
        mask = self.mask[index]  # [b, L]
        width = max(int(mask.sum(dim=1).max()), 1)
        return states[:, :width], mask[:, :width]


def widen(x: torch.Tensor, width: int) -> torch.Tensor:
    """[N, l, ...] zero-padded to [N, width, ...] (padding is masked)."""
    return torch.nn.functional.pad(x, [0, 0] * (x.dim() - 2) + [0, width - x.shape[1]])


@torch.no_grad()
def start_states(view: View, prefix: torch.nn.Module, splits: Sequence[AnySplit], device: torch.device,
                 memory_bytes: int | None = None, spill_dir: Path | None = None) -> StartStates:
    """The start state of every input of ``splits`` (rows in their order): the frozen embedding and prefix, in chunks.
    Text chunks are trimmed to their longest text and zero-padded back to the widest (padding is masked). Past
    ``memory_bytes`` of float32 states they go to ``spill_dir / STATES_FILE`` in float16 instead."""
    first = splits[0]
    probe = prefix(view.embed(*(a.to(device) for a in first.first_args(1))), None)  # [1, l, D]
    masks = [split.key_padding_mask for split in splits]
    width = probe.shape[1] if masks[0] is None else max(m.shape[1] for m in masks if m is not None)
    total = sum(len(split) for split in splits)
    shape = (total, width, view.dim)
    spill = memory_bytes is not None and spill_dir is not None and total * width * view.dim * 4 > memory_bytes
    states = SpilledStates(spill_dir / STATES_FILE, shape) if spill and spill_dir else torch.zeros(shape)
    offset = 0
    for split in splits:
        for index in split.chunk_indices(split.teacher_chunk):
            args = tuple(a.to(device) for a in split.forward_args(index))
            x = prefix(view.embed(*args), key_padding(args)).float().cpu()  # [b, l, D]
            if spill:
                states[index + offset] = x
            else:
                states[index + offset, : x.shape[1]] = x
        offset += len(split)
    mask = None if masks[0] is None else torch.cat([widen(m, width) for m in masks if m is not None])
    return StartStates(states, mask, torch.cat([split.labels for split in splits]))
