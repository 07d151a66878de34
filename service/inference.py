"""One batched forward over several requests: ``sample_rows`` with mixed sample counts, rows split back
per input with ``split_rows`` and summarised per request with ``summarize``. Runs in a worker thread.

Images are bounded by sampled rows (``max_batch_samples``), texts by padded tokens x samples (``max_batch_tokens``):
a text forward is right-padded to its longest text rounded up to a multiple of 8 (``service.texts``)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from models.uncertainty import UncertaintySummary, split_rows, summarize
from service.artifact import Artifact
from service.device import Device
from service.texts import pad_batch, padded_length


def chunks_by_rows(repeats: Sequence[int], max_batch_samples: int) -> list[slice]:
    """Consecutive input ranges whose summed sample counts stay within ``max_batch_samples`` (an input larger than
    ``max_batch_samples`` gets a forward of its own): memory is bounded by rows, not by requests."""
    out, start, rows = [], 0, 0
    for i, count in enumerate(repeats):
        if i > start and rows + count > max_batch_samples:
            out.append(slice(start, i))
            start, rows = i, 0
        rows += count
    if start < len(repeats):
        out.append(slice(start, len(repeats)))
    return out


def forward_rows(artifact: Artifact, device: Device, pixels: torch.Tensor, repeats: list[int],
                 max_batch_samples: int, seed: int | None = None) -> torch.Tensor:
    """Sampled logit rows ``[sum(repeats), C]`` (fp32, CPU), grouped by input in order."""
    outputs = []
    with device.lock, torch.inference_mode(), device.autocast():
        if seed is not None:
            torch.manual_seed(seed)
        for part in chunks_by_rows(repeats, max_batch_samples):
            x = pixels[part].to(device.torch_device, non_blocking=True)  # [b, C, H, W]
            r = torch.tensor(repeats[part], dtype=torch.long, device=device.torch_device)  # [b]
            outputs.append(artifact.module.sample_rows(x, r).float().cpu())  # [sum(r), C]
    return torch.cat(outputs)


def chunks_by_tokens(lengths: Sequence[int], repeats: Sequence[int], max_batch_tokens: int, max_length: int
                     ) -> list[slice]:
    """Consecutive input ranges whose padded width x summed sample counts stays within ``max_batch_tokens`` (an input
    over it gets a forward of its own)."""
    out, start, longest, rows = [], 0, 0, 0
    for i, (length, count) in enumerate(zip(lengths, repeats, strict=True)):
        wider = max(longest, length)
        if i > start and padded_length(wider, max_length) * (rows + count) > max_batch_tokens:
            out.append(slice(start, i))
            start, wider, rows = i, length, 0
        longest, rows = wider, rows + count
    if start < len(repeats):
        out.append(slice(start, len(repeats)))
    return out


def forward_token_rows(artifact: Artifact, device: Device, ids: list[list[int]], repeats: list[int],
                       max_batch_tokens: int, seed: int | None = None) -> tuple[torch.Tensor, int]:
    """Sampled logit rows ``[sum(repeats), C]`` (fp32, CPU) of tokenised texts, grouped by input in order, and the
    padded tokens x samples the forwards ran on."""
    spec = artifact.text
    assert spec is not None
    outputs, tokens = [], 0
    lengths = [len(row) for row in ids]
    with device.lock, torch.inference_mode(), device.autocast():
        if seed is not None:
            torch.manual_seed(seed)
        for part in chunks_by_tokens(lengths, repeats, max_batch_tokens, spec.max_length):
            input_ids, mask = pad_batch(ids[part], spec.pad_id, spec.max_length)  # [b, L] each
            r = torch.tensor(repeats[part], dtype=torch.long)  # [b]
            tokens += int(input_ids.shape[1]) * int(r.sum())
            target = device.torch_device
            outputs.append(artifact.module.sample_rows(input_ids.to(target, non_blocking=True),
                                                       mask.to(target, non_blocking=True),
                                                       r.to(target)).float().cpu())  # [sum(r), C]
    return torch.cat(outputs), tokens


def summarize_requests(rows: torch.Tensor, sizes: list[int], samples: list[int], temperature: float
                       ) -> list[UncertaintySummary]:
    """Split rows back: per input ``[S_i, 1, C]`` blocks, then one ``[S, n, C]`` summary per request."""
    repeats = torch.tensor([s for size, s in zip(sizes, samples, strict=True) for _ in range(size)])
    blocks = split_rows(rows, repeats)  # one [S_i, 1, C] per input
    out, start = [], 0
    for size in sizes:
        out.append(summarize(torch.cat(blocks[start:start + size], dim=1), temperature))  # [S, n, C] -> [n]
        start += size
    return out
