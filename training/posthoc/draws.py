"""Each forward pass of an export computed once: the sampled logits of a (model, split, S, seed) and the per-input
scores of a (model, split), kept while ``shared_draws`` is open (the export opens it around its steps).

The export's steps ask for the same passes again (the reference S's draws after the noise fit at that noise, the test
split's draws at S = 1 when that is the default S), and a path's sampled logits and its per-input scores of one set are
two passes of the same prefix and teacher transitions where the artifact's ``scored_rows`` returns both. The cache
answers a repeat from memory and draws a scoring model's logits and scores in one ``scored_rows`` pass, which consumes
the random stream exactly as its ``forward`` does, so the draws are the ones a separate pass would have made. A
model's scalar buffers (its noise temperature and token correlation) are part of the key: the noise fit changes them
between passes of the same model.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from training.loading import AnySplit

Sampler = Callable[[torch.nn.Module, AnySplit, int], torch.Tensor]  # (model, split, S) -> logits [S, N, C]
Scorer = Callable[[torch.nn.Module, AnySplit], "dict[str, torch.Tensor] | None"]  # (model, split) -> scores [N] each

ROWS_PER_FORWARD = 256  # sample rows per forward, as training.loading.split_sampled_logits takes them


class DrawCache:
    """Sampled logits by (model, split, S, seed, the model's scalar buffers) and per-input scores by (model, split).
    The models and splits are held while the cache lives, so their ids are not reused for other objects."""

    def __init__(self) -> None:
        self.logits: dict[tuple[Any, ...], torch.Tensor] = {}
        self.scores: dict[tuple[int, int], dict[str, torch.Tensor] | None] = {}
        self.held: list[Any] = []

    def _hold(self, model: torch.nn.Module, split: AnySplit) -> tuple[int, int]:
        self.held += [model, split]
        return id(model), id(split)

    def sampled(self, model: torch.nn.Module, split: AnySplit, n_samples: int, seed: int, sampler: Sampler,
                scored: Callable[[], tuple[torch.Tensor, dict[str, torch.Tensor]] | None]) -> torch.Tensor:
        """The logits [S, N, C] under ``seed``: from memory, else from ``scored()`` (logits and scores in one pass;
        None when the model has no scores or they are known), else from ``sampler``."""
        pair = self._hold(model, split)
        key = (*pair, n_samples, seed, scalar_buffers(model))
        if key not in self.logits:
            torch.manual_seed(seed)
            both = scored() if pair not in self.scores else None
            if both is None:
                self.logits[key] = sampler(model, split, n_samples)
            else:
                self.logits[key], self.scores[pair] = both
        return self.logits[key]

    def input_scores(self, model: torch.nn.Module, split: AnySplit, scorer: Scorer) -> dict[str, torch.Tensor] | None:
        pair = self._hold(model, split)
        if pair not in self.scores:
            self.scores[pair] = scorer(model, split)
        return self.scores[pair]


_ACTIVE: list[DrawCache] = []


def active() -> DrawCache | None:
    """The cache of the export in progress (None outside ``shared_draws``)."""
    return _ACTIVE[-1] if _ACTIVE else None


@contextlib.contextmanager
def shared_draws() -> Iterator[DrawCache]:
    """Keep every pass made inside the block for the block's later steps; let them go at its end."""
    cache = DrawCache()
    _ACTIVE.append(cache)
    try:
        yield cache
    finally:
        _ACTIVE.remove(cache)


def scalar_buffers(model: torch.nn.Module) -> tuple[float, ...]:
    """The values of a model's one-element buffers (noise temperature, token correlation): what changes its draws
    between passes besides the seed."""
    return tuple(float(b) for _, b in model.named_buffers() if b.numel() == 1)


def scored_pass(model: torch.nn.Module, split: AnySplit, n_samples: int, names: tuple[str, ...]
                ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Logits [S, N, C] and per-input scores ([N] each, ``names``) of ``split`` from one ``scored_rows`` pass, in the
    chunks ``split_sampled_logits`` takes (so the same random draws as its ``forward``)."""
    chunk = max(1, ROWS_PER_FORWARD // n_samples)
    classes: list[int] = []

    def fn(*args: torch.Tensor) -> torch.Tensor:
        batch = args[0].shape[0]
        repeats = torch.full((batch,), n_samples, dtype=torch.long, device=args[0].device)  # [b]
        rows, scores = model.scored_rows(*args, repeats)  # [b*S, C], [b, F] (or [b])
        classes[:] = [rows.shape[-1]]
        return torch.cat([rows.float().cpu().reshape(batch, -1),  # [b, S*C] grouped by input
                          scores.float().cpu().reshape(batch, -1)], dim=1)  # [b, S*C + F]

    table = split.map(fn, chunk)  # [N, S*C + F]
    width = n_samples * classes[0]
    logits = table[:, :width].reshape(len(split), n_samples, classes[0]).transpose(0, 1)  # [S, N, C]
    return logits.contiguous(), {name: table[:, width + i] for i, name in enumerate(names)}
