"""One batched forward over several requests: ``sample_rows`` (or ``scored_rows``, when the OOD score needs a
per-input score: the kernel error or a feature-space score) with mixed sample counts, rows split back per input with
``split_rows`` and summarised per request with ``summarize``. Runs in a worker thread.

Images are bounded by sampled rows (``max_batch_samples``), texts by padded tokens x samples (``max_batch_tokens``):
a text forward is right-padded to its longest text rounded up to a multiple of 8 (``service.texts``)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence

import torch

from models.uncertainty import UncertaintySummary, split_rows, summarize
from service.artifact import Artifact
from service.device import Device
from service.shapes import pad_pixels, pad_tokens
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
                 max_batch_samples: int, seed: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Sampled logit rows ``[sum(repeats), C]`` (fp32, host), grouped by input in order, and the per-input scores
    ``[n, F]`` when the artifact's OOD score needs them (else None). Each forward is padded to the device's
    shape buckets (``service.shapes``) and its padding dropped; results stay on the device until one copy back."""
    outputs, errors = [], []
    with seeded_or_shared(device, seed) as turn, torch.inference_mode(), device.autocast(), device.guard_memory():
        for part in chunks_by_rows(repeats, max_batch_samples):
            padding = device.shapes.padding(repeats[part])
            x = device.to_device(pad_pixels(pixels[part], padding))  # [inputs, C, H, W]
            r = device.to_device(padding.repeats(repeats[part]))  # [inputs]
            with turn():
                rows, error = artifact.rows(x, r)  # [rows, C], [inputs, F] or None
            outputs.append(rows[:padding.real_rows])  # [sum(repeats[part]), C]
            if error is not None:
                errors.append(error[:padding.real_inputs])  # [len(part)]
        return device.to_host(torch.cat(outputs).float()), host_errors(device, errors)


@contextlib.contextmanager
def seeded_or_shared(device: Device, seed: int | None) -> Iterator[Callable[[], contextlib.AbstractContextManager]]:
    """How a batch's forwards take the device: a seeded batch holds its gate alone for all of them (no other forward
    may draw from the generator between two of its forwards, or its answer would not repeat); any other batch takes
    a shared turn per forward, so another model's batch runs beside it (up to the gate's slots) or between its
    forwards rather than wait for all of them. Yields what each forward is wrapped in."""
    if seed is None:
        yield device.lock.shared
        return
    with device.lock:
        torch.manual_seed(seed)
        yield contextlib.nullcontext


def host_errors(device: Device, errors: list[torch.Tensor]) -> torch.Tensor | None:
    """The forwards' per-input scores as one fp32 host matrix [n, F], or None when the artifact computed none."""
    return device.to_host(torch.cat(errors).float()) if errors else None


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
                       max_batch_tokens: int, seed: int | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor | None, int]:
    """Sampled logit rows ``[sum(repeats), C]`` (fp32, host) of tokenised texts, grouped by input in order, the
    per-input scores ``[n, F]`` (or None, as ``forward_rows``) and the padded tokens x samples the forwards ran on
    (shape-bucket padding included)."""
    spec = artifact.text
    assert spec is not None
    outputs, errors, tokens = [], [], 0
    lengths = [len(row) for row in ids]
    with seeded_or_shared(device, seed) as turn, torch.inference_mode(), device.autocast(), device.guard_memory():
        for part in chunks_by_tokens(lengths, repeats, max_batch_tokens, spec.max_length):
            padding = device.shapes.padding(repeats[part], text=True)
            input_ids, mask = pad_tokens(*pad_batch(ids[part], spec.pad_id, spec.max_length), padding, spec.pad_id)
            tokens += int(input_ids.shape[1]) * padding.rows
            with turn():
                rows, error = artifact.rows(device.to_device(input_ids), device.to_device(mask),
                                            device.to_device(padding.repeats(repeats[part])))  # [rows, C], [inputs, F]
            outputs.append(rows[:padding.real_rows])  # [sum(repeats[part]), C]
            if error is not None:
                errors.append(error[:padding.real_inputs])  # [len(part)]
        return device.to_host(torch.cat(outputs).float()), host_errors(device, errors), tokens


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


def split_scores(errors: torch.Tensor | None, sizes: list[int]) -> list[torch.Tensor | None]:
    """The batch's per-input scores [sum(sizes), F] back per request ([n, F] each), or None for each when there are
    none."""
    if errors is None:
        return [None] * len(sizes)
    return list(torch.split(errors, sizes))
