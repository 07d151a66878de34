"""Sampled logits on disk, keyed by model fingerprint and input set, so an evaluation can span sessions and a
rerun samples nothing it has already sampled."""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Callable
from pathlib import Path

import torch

from training.runtime import save_checkpoint


def fingerprint(*parts: Path | str | float) -> str:
    """A short id of the files (by content) and settings a model is built from."""
    digest = hashlib.sha256()
    for part in parts:
        if isinstance(part, Path):
            digest.update(part.read_bytes())
        else:
            digest.update(repr(part).encode())
    return digest.hexdigest()[:12]


def stable_seed(*names: str) -> int:
    """A seed derived from names that is the same in every process (``hash()`` is salted per process)."""
    return zlib.crc32("/".join(names).encode())


class LogitCache:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)

    def get(self, model_id: str, set_name: str, n_samples: int, compute: Callable[[], torch.Tensor]) -> torch.Tensor:
        """Logits [S, N, C] of ``compute()``, computed once under a seed fixed by the key, then read from disk."""
        path = self.folder / f"{model_id}__{set_name}__s{n_samples}.pt"
        if path.exists():
            return torch.load(path, weights_only=True)["logits"]
        torch.manual_seed(stable_seed(model_id, set_name, str(n_samples)))
        logits = compute().float().contiguous()
        save_checkpoint(path, {"logits": logits})
        return logits
