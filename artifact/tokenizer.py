"""What a text artifact's tokenizer must do for the server to serve it. The server checks it when it loads a version
and the pipeline checks it before it trains one, with this one function, so a version the server would refuse is never
built. The tokenizer is a ``tokenizers.Tokenizer``, read through the few methods named here (this package imports
only the standard library and pydantic)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class Encoding(Protocol):
    @property
    def ids(self) -> list[int]: ...

    @property
    def overflowing(self) -> Sequence[object]: ...


class TextTokenizer(Protocol):
    def encode_batch(self, texts: list[str], /) -> Sequence[Encoding]: ...

    def num_special_tokens_to_add(self, is_pair: bool, /) -> int: ...

    def get_vocab_size(self, with_added_tokens: bool = True, /) -> int: ...


def warm_up_texts(max_length: int) -> list[str]:
    """A short text and one longer than ``max_length`` tokens (each word is at least one token): the warm-up forward
    runs at the full width, with padding and truncation, before the first request does."""
    return ["a warm-up sentence.", "warm up " * max_length]


def tokenizer_problem(tokenizer: TextTokenizer, max_length: int, pad_id: int) -> str | None:
    """Why the server cannot serve texts with ``tokenizer`` (set to truncate at ``max_length`` and not to pad), or
    None: room for text beside the special tokens, a pad id inside the vocabulary, and a text longer than
    ``max_length`` read as ``max_length`` tokens. The last fails for a tokenizer whose vocabulary holds only its
    special tokens, which reads every text as those alone."""
    if tokenizer.num_special_tokens_to_add(False) >= max_length:
        return f"max_length {max_length} leaves no room beside the tokenizer's special tokens"
    vocab = tokenizer.get_vocab_size(True)
    if not 0 <= pad_id < vocab:
        return f"pad_id {pad_id} outside the tokenizer's vocabulary of {vocab}"
    longest = tokenizer.encode_batch(warm_up_texts(max_length))[1]
    if len(longest.ids) != max_length or not longest.overflowing:
        return f"the tokenizer gave {len(longest.ids)} tokens for a text longer than max_length {max_length}"
    return None
