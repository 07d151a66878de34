"""Text models: strings checked against the limits and tokenised with the artifact's own ``tokenizers`` file
(``TextDecoder``; ``service.engine.texts`` has the rules); a batch is a list of tokenised texts, costed in padded
tokens x samples and right-padded per forward to its longest text (``TextRunner``)."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer

from artifact.contract import Manifest, TextInput
from artifact.tokenizer import tokenizer_problem, warm_up_texts
from service.engine.batch_cost import BatchCost
from service.engine.device import Device
from service.engine.inference import Chunk, chunks_by_cost, run_forwards
from service.engine.modalities.base import (
    BatchRunner,
    Forward,
    InputBatch,
    InputDecoder,
    InputLimits,
    Modality,
    RawInput,
    RowsFunction,
    TensorSpec,
    Text,
)
from service.engine.shapes import Padding
from service.engine.texts import PAD_MULTIPLE, EncodedText, check_text, encode, pad_batch, padded_length
from service.errors import invalid


@dataclass(frozen=True)
class TokenBatch(InputBatch):
    texts: list[EncodedText]
    size: int = field(init=False)
    longest: int = field(init=False)  # tokens of the longest text
    extras: Mapping[str, list[Any]] = field(init=False)  # tokens, truncated, dropped_tokens per text

    def __post_init__(self) -> None:
        texts = self.texts
        object.__setattr__(self, "size", len(texts))
        object.__setattr__(self, "longest", max((text.tokens for text in texts), default=0))
        object.__setattr__(self, "extras", {"tokens": [t.tokens for t in texts],
                                            "truncated": [t.truncated for t in texts],
                                            "dropped_tokens": [t.dropped_tokens for t in texts]})


def pad_tokens(input_ids: torch.Tensor, mask: torch.Tensor, padding: Padding, pad_id: int
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """``[b, L]`` ids and mask -> ``[padding.inputs, L]``: each padding input is one visible pad token (a fully
    masked row would make its attention softmax NaN)."""
    extra = padding.inputs - padding.real_inputs
    if extra == 0:
        return input_ids, mask
    ids = input_ids.new_full((extra, input_ids.shape[1]), pad_id)  # [extra, L]
    visible = mask.new_zeros((extra, mask.shape[1]))  # [extra, L]
    visible[:, 0] = 1
    return torch.cat([input_ids, ids]), torch.cat([mask, visible])  # [inputs, L] each


def load_tokenizer(folder: Path, spec: TextInput) -> Tokenizer:
    """The artifact's ``tokenizers`` tokenizer, truncating as the manifest says (whatever the file says) and never
    padding (batches are padded by the server)."""
    try:
        tokenizer = Tokenizer.from_file(str(folder / spec.tokenizer))
    except Exception as exc:  # the Rust side raises plain Exceptions
        raise ValueError(f"{spec.tokenizer} is not a tokenizers file: {exc}") from exc
    tokenizer.no_padding()
    tokenizer.enable_truncation(spec.max_length, stride=0, strategy="longest_first", direction=spec.truncation_side)
    problem = tokenizer_problem(tokenizer, spec.max_length, spec.pad_id)  # the pipeline refuses the same at plan time
    if problem is not None:
        raise ValueError(problem)
    return tokenizer


def load(manifest: Manifest, folder: Path) -> Modality:
    """A text model's decoder and runner, with the artifact's tokenizer (``ValueError`` when it is unusable)."""
    spec = manifest.input
    if not isinstance(spec, TextInput):
        raise ValueError("a text model's manifest needs a text input section")
    tokenizer = load_tokenizer(folder, spec)
    return Modality(TextDecoder(spec, tokenizer), TextRunner(spec, tokenizer))


class TextDecoder(InputDecoder):
    modality = "text"
    takes = (Text,)
    # one string per input, as Triton batches strings: [N, 1]
    extra_outputs = (TensorSpec("tokens", "INT64", (1,)), TensorSpec("truncated", "BOOL", (1,)),
                     TensorSpec("dropped_tokens", "INT64", (1,)))

    def __init__(self, spec: TextInput, tokenizer: Tokenizer) -> None:
        self.spec = spec
        self.tokenizer = tokenizer  # truncation set from ``spec``, no padding
        self.tensor = TensorSpec("text", "BYTES", (1,))

    def parameters(self) -> dict[str, Any]:
        return {"max_length": self.spec.max_length}

    def describe(self) -> str:
        return 'text: {"text": ...}'

    def max_characters(self, limits: InputLimits) -> int:
        """Longest text (characters) this server accepts: the manifest's ``input.max_characters`` or
        ``DIRECTOR_MAX_TEXT_CHARS``, whichever is lower."""
        return min(self.spec.max_characters, limits.max_text_chars)

    def decode(self, items: Sequence[RawInput], limits: InputLimits, model: str) -> TokenBatch:
        self.check_kinds(items, model)
        texts = [item for item in items if isinstance(item, Text)]
        limit = self.max_characters(limits)
        for item in texts:
            check_text(item.text, limit, item.loc)
        encoded = encode(self.tokenizer, [item.text for item in texts])
        for text, item in zip(encoded, texts, strict=True):
            if text.tokens == 0:  # a tokenizer without special tokens (a decoder's) can read nothing in a text
                where = ".".join(str(part) for part in item.loc) if item.loc else "text"
                raise invalid(f"{where}: the model's tokenizer reads no token in this text", item.loc)
        return TokenBatch(encoded)


class TextRunner(BatchRunner):
    def __init__(self, spec: TextInput, tokenizer: Tokenizer) -> None:
        self.spec = spec
        self.tokenizer = tokenizer  # the warm-up's example texts only

    def join(self, batches: Sequence[InputBatch]) -> TokenBatch:
        return TokenBatch([text for batch in batches if isinstance(batch, TokenBatch) for text in batch.texts])

    def part(self, batch: InputBatch, start: int, stop: int) -> TokenBatch:
        assert isinstance(batch, TokenBatch)
        return TokenBatch(batch.texts[start:stop])

    def batch_cost(self, max_batch_samples: int, max_batch_tokens: int) -> BatchCost:
        unit = "padded tokens x samples (inputs x n_samples x the longest text's tokens, rounded up to 8)"
        width = functools.partial(padded_length, max_length=self.spec.max_length)
        return BatchCost(max_batch_tokens, "max_batch_tokens", unit, width)

    def forward(self, model: RowsFunction, device: Device, batch: InputBatch, repeats: list[int], cost: BatchCost,
                seed: int | None) -> Forward:
        assert isinstance(batch, TokenBatch)
        ids = [text.ids for text in batch.texts]
        tokens = 0

        def chunks() -> list[Chunk]:
            nonlocal tokens
            out, max_rows = [], cost.max_rows
            for part in chunks_by_cost(repeats, [len(row) for row in ids], cost):
                padding = device.shapes.padding(repeats[part], max_rows)
                counts = padding.repeats(repeats[part])  # [inputs]
                input_ids, mask = pad_tokens(*pad_batch(ids[part], self.spec.pad_id, self.spec.max_length), padding,
                                             self.spec.pad_id)  # [inputs, L] each
                tokens += int(input_ids.shape[1]) * padding.rows
                out.append(Chunk((input_ids, mask, counts), padding))
            return out

        rows, scores = run_forwards(model, device, chunks(), seed)
        return Forward(rows, scores, tokens, padded_length(batch.longest, self.spec.max_length))

    def example(self) -> tuple[torch.Tensor, ...]:
        """A short text and one truncated to max_length (``load_tokenizer`` checked that it fills it), padded like a
        served batch, so the whole position table is used."""
        texts = encode(self.tokenizer, warm_up_texts(self.spec.max_length))
        return pad_batch([t.ids for t in texts], self.spec.pad_id, self.spec.max_length)  # [2, L] each

    def filler(self, inputs: int, rows: int, cost: BatchCost) -> tuple[torch.Tensor, ...]:
        """Pad tokens at the widest width (a multiple of 8, at most ``max_length``) a forward of ``rows`` rows can
        have within the token budget."""
        width = max(PAD_MULTIPLE, cost.budget // rows // PAD_MULTIPLE * PAD_MULTIPLE)
        width = min(width, self.spec.max_length)
        ids = torch.full((inputs, width), self.spec.pad_id, dtype=torch.long)  # [inputs, L]
        return ids, torch.ones(inputs, width, dtype=torch.long)  # [inputs, L] each
