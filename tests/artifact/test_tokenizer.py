"""The one check of a text artifact's tokenizer that the server runs when it loads a version and the pipeline runs
before it trains one: a tokenizer that reads a long text as fewer tokens than max_length, leaves no room beside its
special tokens or pads with an id outside its vocabulary is refused, with the reason."""

from __future__ import annotations

from tokenizers import Tokenizer
from tokenizers.models import BPE, WordLevel
from tokenizers.normalizers import Replace
from tokenizers.pre_tokenizers import Whitespace
from tokenizers.processors import TemplateProcessing

from artifact.tokenizer import tokenizer_problem, warm_up_texts


def word_level(vocabulary: list[str], max_length: int) -> Tokenizer:
    """Whitespace words, truncating at ``max_length`` as the server sets it."""
    tokenizer = Tokenizer(WordLevel({w: i for i, w in enumerate(["[PAD]", "[UNK]", *vocabulary])}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = Whitespace()
    tokenizer.enable_truncation(max_length)
    return tokenizer


def test_a_tokenizer_that_reads_every_word_serves() -> None:
    assert tokenizer_problem(word_level(["warm", "up"], 8), 8, pad_id=0) is None
    assert len(warm_up_texts(8)[1].split()) > 8  # the long text is longer than max_length whatever the tokenizer


def test_a_tokenizer_the_server_would_refuse_is_named_with_why() -> None:
    empty = Tokenizer(BPE())  # no vocabulary: reads nothing in any text
    empty.enable_truncation(8)
    assert tokenizer_problem(empty, 8, pad_id=0) == "pad_id 0 outside the tokenizer's vocabulary of 0"
    assert tokenizer_problem(word_level([], 8), 8, pad_id=9) == "pad_id 9 outside the tokenizer's vocabulary of 2"
    special = word_level([], 2)
    special.post_processor = TemplateProcessing(single="[PAD] $A [PAD]", special_tokens=[("[PAD]", 0)])
    assert tokenizer_problem(special, 2, 0) == "max_length 2 leaves no room beside the tokenizer's special tokens"
    unread = word_level([], 8)
    unread.add_special_tokens(["[CLS]"])
    unread.post_processor = TemplateProcessing(single="[CLS] $A", special_tokens=[("[CLS]", 2)])
    unread.normalizer = Replace("warm up", "")  # the text's words vanish: only [CLS] is left of it
    assert tokenizer_problem(unread, 8, pad_id=0) == "the tokenizer gave 1 tokens for a text longer than max_length 8"
