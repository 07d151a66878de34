"""One batched forward over several requests, whatever the modality: the batch is cut into forwards within the
budget (``chunks_by_cost``), each forward padded to the device's shape buckets (``service.engine.shapes``) by the
model's batch runner and run through ``sample_rows`` (or ``scored_rows``, when the OOD score needs a per-input
score: the kernel error or a feature-space score) with mixed sample counts; rows are summarised with ``summarize``
once per sample count and split back per request. Runs in a worker thread."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch

from models.uncertainty import UncertaintySummary, summarize
from service.engine.batch_cost import BatchCost
from service.engine.device import Device
from service.engine.shapes import Padding

Summarize = Callable[[torch.Tensor, float | torch.Tensor], UncertaintySummary]  # sampled logits [S, B, C] -> [B]


@dataclass(frozen=True)
class Chunk:
    """One forward: the model inputs (host tensors, padded, ``repeats`` last) and how they were padded."""

    inputs: tuple[torch.Tensor, ...]
    padding: Padding


def chunks_by_cost(repeats: Sequence[int], widths: Sequence[int], cost: BatchCost) -> list[slice]:
    """Consecutive input ranges whose summed sample counts, at the range's widest input, stay within the budget (an
    input over it gets a forward of its own): memory is bounded by rows, not by requests."""
    out, start, widest, rows = [], 0, 0, 0
    for i, (count, width) in enumerate(zip(repeats, widths, strict=True)):
        wider = max(widest, width)
        if i > start and not cost.fits(rows + count, wider):
            out.append(slice(start, i))
            start, wider, rows = i, width, 0
        widest, rows = wider, rows + count
    if start < len(repeats):
        out.append(slice(start, len(repeats)))
    return out


def run_forwards(model: Callable[..., tuple[torch.Tensor, torch.Tensor | None]], device: Device,
                 chunks: Iterable[Chunk], seed: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Sampled logit rows ``[sum(repeats), C]`` (fp32, host), grouped by input in order, and the per-input scores
    ``[n, F]`` when the artifact's OOD score needs them (else None). Each forward's padding is dropped; results stay
    on the device until one copy back."""
    outputs, scores = [], []
    with seeded_or_shared(device, seed) as turn, torch.inference_mode(), device.autocast(), device.guard_memory():
        for chunk in chunks:
            inputs = tuple(map(device.to_device, chunk.inputs))
            with turn():
                rows, score = model(*inputs)  # [rows, C], [inputs, F] or None
            outputs.append(rows[:chunk.padding.real_rows])  # [real rows, C]
            if score is not None:
                scores.append(score[:chunk.padding.real_inputs])  # [real inputs, F]
        host_rows = device.to_host(torch.cat(outputs).float())  # [sum(repeats), C]
        return host_rows, device.to_host(torch.cat(scores).float()) if scores else None  # [n, F] or None


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


def summarize_requests(rows: torch.Tensor, sizes: list[int], samples: list[int], temperature: float | torch.Tensor,
                       summarize: Summarize = summarize) -> list[UncertaintySummary]:
    """One ``summarize`` per sample count in the batch over all its inputs with that count (one call for a batch whose
    requests share it), then each request's slice; ``temperature`` is one for all or one per input ([n]);
    ``summarize``: the version's task's (``service.engine.tasks``), a softmax's by default.
    Summarising request by request cost a dozen small tensor operations per request in the forward's thread: 1.68 ms
    for a batch of 32 one-sample requests, 0.49 ms this way (one thread; docs/benchmarks-overhead.md)."""
    counts = [s for size, s in zip(sizes, samples, strict=True) for _ in range(size)]  # per input
    starts = torch.tensor([0, *counts]).cumsum(0)[:-1]  # [n]: each input's first row
    fields: dict[str, list[torch.Tensor]] = {}
    order: list[torch.Tensor] = []
    kind: type[UncertaintySummary] = UncertaintySummary
    for s in sorted(set(counts)):
        inputs = torch.tensor([i for i, c in enumerate(counts) if c == s])  # [m]
        picked = rows[(starts[inputs, None] + torch.arange(s)).reshape(-1)]  # [m * S, C], input by input
        scale = temperature[inputs] if isinstance(temperature, torch.Tensor) else temperature  # [m] or one
        summary = summarize(picked.view(len(inputs), s, -1).transpose(0, 1), scale)  # [S, m, C] -> [m]
        kind = type(summary)
        for name, value in vars(summary).items():
            fields.setdefault(name, []).append(value)
        order.append(inputs)
    back = torch.argsort(torch.cat(order))  # [n]: input i's position among the grouped ones
    whole = {name: torch.cat(parts)[back] for name, parts in fields.items()}  # each [n] (per label: [n, C])
    out, start = [], 0
    for size in sizes:
        out.append(kind(**{name: value[start:start + size] for name, value in whole.items()}))
        start += size
    return out


def split_scores(scores: Mapping[str, torch.Tensor] | None, sizes: list[int]) -> list[dict[str, torch.Tensor] | None]:
    """The batch's per-input scores by name ([sum(sizes)] each) back per request ([n] each), or None for each when
    there are none."""
    if scores is None:
        return [None] * len(sizes)
    parts = {name: torch.split(values, sizes) for name, values in scores.items()}
    return [{name: split[i] for name, split in parts.items()} for i in range(len(sizes))]
