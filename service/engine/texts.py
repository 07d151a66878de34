"""Text inputs of text models: limits, tokenisation with the artifact's ``tokenizers`` tokenizer, padded batches.

The rules (documented in docs/api.md and the OpenAPI schema):
- characters: a text longer than the model's character limit, min(manifest ``input.max_characters``,
  ``DIRECTOR_MAX_TEXT_CHARS``), is refused with 413. The exporter cut longer texts to ``max_characters`` before
  tokenising; the server refuses them instead, so that no answer silently ignores part of what was sent.
- empty: a text with nothing but whitespace is refused with 422 (it would be [CLS] [SEP] only).
- not Unicode: a text holding a lone UTF-16 surrogate (a JSON escape such as ``\\ud800`` that pairs with nothing) is
  refused with 422; UTF-8 cannot encode it, so the tokenizer could not read it.
- tokens: the tokenizer truncates to the manifest's ``input.max_length`` tokens ([CLS] and [SEP] included) on the
  manifest's truncation side; every prediction of a text model reports ``tokens`` (read by the model),
  ``truncated`` and ``dropped_tokens``.
- batches: the token ids of a forward are padded on the RIGHT (BERT positions are absolute: a text's tokens must
  start at position 0) with the manifest's ``pad_id`` to the forward's longest text rounded up to a multiple of
  ``PAD_MULTIPLE`` (never beyond ``max_length``, the artifact's position table); ``attention_mask`` is 1 on real
  tokens. The artifact masks padding in attention and pooling, so padding changes no answer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tokenizers import Tokenizer

from service.errors import invalid, too_large

PAD_MULTIPLE = 8


@dataclass(frozen=True)
class EncodedText:
    """One tokenised text: ``ids`` after truncation, special tokens included, not padded."""

    ids: list[int]
    dropped_tokens: int  # tokens cut off by truncation (0: the whole text was read)

    @property
    def tokens(self) -> int:
        return len(self.ids)

    @property
    def truncated(self) -> bool:
        return self.dropped_tokens > 0


def lone_surrogate(text: str) -> int | None:
    """Position of the first lone UTF-16 surrogate in ``text`` (None: it is Unicode text). JSON lets a string escape
    one (``"\\ud800"``) and Python's parser keeps it, but it is no character: UTF-8 cannot encode it, so a tokenizer,
    SQLite or the response encoder would fail on it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None


def surrogate_message(text: str) -> str | None:
    position = lone_surrogate(text)
    if position is None:
        return None
    return f"holds a lone UTF-16 surrogate ({text[position]!a} at character {position}), which is not Unicode text"


def check_text(text: str, max_characters: int, loc: list[str | int]) -> None:
    """413 over the character limit, 422 when there is nothing but whitespace or when it is not Unicode text."""
    where = ".".join(str(part) for part in loc) if loc else "text"
    if len(text) > max_characters:
        raise too_large(f"{where}: text has {len(text)} characters, the limit for this model is {max_characters}")
    if not text.strip():
        raise invalid(f"{where}: text is empty", loc)
    surrogate = surrogate_message(text)
    if surrogate is not None:
        raise invalid(f"{where}: text {surrogate}", loc)


def encode(tokenizer: Tokenizer, texts: list[str]) -> list[EncodedText]:
    """Tokenise ``texts`` with the (truncating, non-padding) tokenizer. With stride 0 every overflowing piece holds the
    next tokens of the text plus the special tokens the post-processor adds to each piece, so the dropped count is
    exact."""
    special = tokenizer.num_special_tokens_to_add(False)
    out = []
    for encoding in tokenizer.encode_batch(texts):
        dropped = sum(max(len(piece.ids) - special, 0) for piece in encoding.overflowing)
        out.append(EncodedText(list(encoding.ids), dropped))
    return out


def padded_length(longest: int, max_length: int, multiple: int = PAD_MULTIPLE) -> int:
    """The width a forward whose longest text has ``longest`` tokens is padded to."""
    return min(-(-max(longest, 1) // multiple) * multiple, max_length)


def pad_batch(ids: list[list[int]], pad_id: int, max_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ``input_ids`` and ``attention_mask``, both int64 [B, L], L = ``padded_length`` of the longest."""
    width = padded_length(max(len(row) for row in ids), max_length)
    input_ids = torch.full((len(ids), width), pad_id, dtype=torch.long)  # [B, L]
    mask = torch.zeros(len(ids), width, dtype=torch.long)  # [B, L]
    for i, row in enumerate(ids):
        input_ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        mask[i, : len(row)] = 1
    return input_ids, mask
