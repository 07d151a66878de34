"""Baseline methods behind the same artifact contract as DIRECTOR (docs/architecture.md), so the server and
the evaluation treat every method alike: ``forward(pixels, n_samples) -> [S, B, C]`` logits and
``sample_rows(pixels, repeats) -> [sum(repeats), C]`` with rows grouped by input. All are scriptable.
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.nn import functional as F


def rows_to_samples(rows: torch.Tensor, batch: int, n_samples: int) -> torch.Tensor:
    """``sample_rows`` output [B*S, C] grouped by input -> [S, B, C]."""
    return rows.view(batch, n_samples, -1).transpose(0, 1)


class DeterministicModel(nn.Module):
    """The plain backbone: every sample row of an input is the same logit vector."""

    def __init__(self, classifier: nn.Module) -> None:
        super().__init__()
        self.classifier = classifier

    @torch.jit.export
    def sample_rows(self, pixels: torch.Tensor, repeats: torch.Tensor) -> torch.Tensor:
        logits = self.classifier(pixels)  # [B, C]
        return torch.repeat_interleave(logits, repeats, dim=0, output_size=int(repeats.sum()))  # [R, C]

    def forward(self, pixels: torch.Tensor, n_samples: int) -> torch.Tensor:
        return self.classifier(pixels).unsqueeze(0).expand(n_samples, -1, -1)  # [S, B, C]


class AlwaysDropout(nn.Module):
    """Dropout that stays on in ``eval()``: MC dropout must survive the server calling ``module.eval()``."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.dropout(x, self.p, True)


def with_always_dropout(module: nn.Module) -> nn.Module:
    """A copy of ``module`` whose ``nn.Dropout`` layers with p > 0 are ``AlwaysDropout`` (DropPath stays off)."""
    module = copy.deepcopy(module)
    for name, child in list(module.named_modules()):
        if isinstance(child, nn.Dropout) and child.p > 0:
            parent_name, _, attr = name.rpartition(".")
            setattr(module.get_submodule(parent_name) if parent_name else module, attr, AlwaysDropout(child.p))
    return module


def count_always_dropout(module: nn.Module) -> int:
    return sum(1 for m in module.modules() if isinstance(m, AlwaysDropout))


class MCDropoutModel(nn.Module):
    """MC dropout: each sample row is one pass of the backbone with its dropout layers on."""

    def __init__(self, classifier: nn.Module) -> None:
        super().__init__()
        self.classifier = with_always_dropout(classifier)
        if count_always_dropout(self.classifier) == 0:
            raise ValueError("MC dropout needs a backbone trained with dropout (drop_rate or proj_drop_rate > 0)")

    @torch.jit.export
    def sample_rows(self, pixels: torch.Tensor, repeats: torch.Tensor) -> torch.Tensor:
        rows = torch.repeat_interleave(pixels, repeats, dim=0, output_size=int(repeats.sum()))  # [R, C, H, W]
        return self.classifier(rows)  # [R, C]

    def forward(self, pixels: torch.Tensor, n_samples: int) -> torch.Tensor:
        batch = pixels.shape[0]
        repeats = torch.full((batch,), n_samples, dtype=torch.long, device=pixels.device)
        return rows_to_samples(self.sample_rows(pixels, repeats), batch, n_samples)  # [S, B, C]


class EnsembleModel(nn.Module):
    """Deep ensemble of M independently trained backbones: sample row j of an input is member j mod M, so
    S = M gives each member once (S > M repeats members: no new information)."""

    def __init__(self, members: list[nn.Module]) -> None:
        super().__init__()
        if not members:
            raise ValueError("an ensemble needs at least one member")
        self.members = nn.ModuleList(members)
        self.num_members = len(members)

    @torch.jit.export
    def sample_rows(self, pixels: torch.Tensor, repeats: torch.Tensor) -> torch.Tensor:
        outputs: list[torch.Tensor] = []
        for member in self.members:
            outputs.append(member(pixels))
        stacked = torch.stack(outputs)  # [M, B, C]
        batch = pixels.shape[0]
        inputs = torch.repeat_interleave(torch.arange(batch, device=pixels.device), repeats, dim=0,
                                         output_size=int(repeats.sum()))  # [R]
        starts = torch.cumsum(repeats, 0) - repeats  # [B]
        position = torch.arange(inputs.shape[0], device=pixels.device) - starts[inputs]  # [R]
        return stacked[position % self.num_members, inputs]  # [R, C]

    def forward(self, pixels: torch.Tensor, n_samples: int) -> torch.Tensor:
        batch = pixels.shape[0]
        repeats = torch.full((batch,), n_samples, dtype=torch.long, device=pixels.device)
        return rows_to_samples(self.sample_rows(pixels, repeats), batch, n_samples)  # [S, B, C]


class PackedTokenClassifier(nn.Module):
    """A text classifier ``(input_ids, attention_mask) -> [B, C]`` read as a one-tensor classifier of packed
    tokens [B, 2, L] (ids, mask), so the baselines above serve text unchanged: repeating a packed row repeats
    the text with its mask."""

    def __init__(self, classifier: nn.Module) -> None:
        super().__init__()
        self.classifier = classifier

    def forward(self, packed: torch.Tensor) -> torch.Tensor:
        return self.classifier(packed[:, 0], packed[:, 1])  # [B, C]


class TokenInputs(nn.Module):
    """The text side of the artifact contract over a baseline built on ``PackedTokenClassifier``:
    ``forward(input_ids, attention_mask, n_samples) -> [S, B, C]``."""

    def __init__(self, baseline: nn.Module) -> None:
        super().__init__()
        self.baseline = baseline

    def sample_rows(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, repeats: torch.Tensor) -> torch.Tensor:
        return self.baseline.sample_rows(torch.stack((input_ids, attention_mask), dim=1), repeats)  # [R, C]

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, n_samples: int) -> torch.Tensor:
        return self.baseline(torch.stack((input_ids, attention_mask), dim=1), n_samples)  # [S, B, C]
