"""Text inputs (``service.engine.texts``): what ``check_text`` refuses and with which status, how many tokens
truncation drops, and the right-padded batches; on a word-level tokenizer built in memory."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace
from tokenizers.processors import TemplateProcessing

from service.engine.texts import EncodedText, check_text, encode, lone_surrogate, pad_batch, surrogate_message
from service.errors import ApiError

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "one", "two", "three", "four", "five", "six", "seven", "eight"]
LOC: list[str | int] = ["inputs", 0, "text"]


def tokenizer(max_length: int, special: bool = True, direction: str = "right") -> Tokenizer:
    """Whitespace words, [CLS] text [SEP] when ``special``, truncating at ``max_length`` as the server sets it."""
    built = Tokenizer(WordLevel({word: i for i, word in enumerate(WORDS)}, unk_token="[UNK]"))
    built.pre_tokenizer = Whitespace()
    if special:
        built.post_processor = TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    built.enable_truncation(max_length, stride=0, strategy="longest_first", direction=direction)
    return built


def refusal(text: str, max_characters: int, loc: list[str | int]) -> ApiError:
    with pytest.raises(ApiError) as error:
        check_text(text, max_characters, loc)
    return error.value


def test_a_text_over_the_character_limit_is_413_and_at_it_passes() -> None:
    check_text("x" * 10, 10, LOC)
    error = refusal("x" * 11, 10, LOC)
    assert error.status == 413 and error.message == (
        "inputs.0.text: text has 11 characters, the limit for this model is 10")


def test_a_text_of_whitespace_alone_is_422() -> None:
    for text in ("", " ", "\n\t "):
        error = refusal(text, 10, LOC)
        assert (error.status, error.message) == (422, "inputs.0.text: text is empty")
        assert error.details == [{"loc": LOC, "msg": error.message}]
    assert refusal(" ", 10, []).message == "text: text is empty"  # no location: named as the text


def test_a_lone_surrogate_is_422_naming_where_it_is() -> None:
    assert lone_surrogate("ok \U0001f600") is None and surrogate_message("plain") is None
    assert lone_surrogate("ab\ud800cd") == 2
    error = refusal("ab\ud800cd", 10, LOC)
    assert error.status == 422 and error.message == (
        "inputs.0.text: text holds a lone UTF-16 surrogate ('\\ud800' at character 2), which is not Unicode text")


def test_the_character_limit_is_checked_before_anything_else() -> None:
    assert refusal(" " * 11, 10, LOC).status == 413
    assert refusal("\ud800" * 11, 10, LOC).status == 413


def test_truncation_reports_exactly_the_tokens_it_dropped() -> None:
    words = "one two three four five six seven eight"
    whole, cut, unknown = encode(tokenizer(16), [words, words, "nine ten"])
    assert whole == EncodedText([2, 4, 5, 6, 7, 8, 9, 10, 11, 3], 0) and not whole.truncated
    assert (whole.tokens, cut.tokens) == (10, 10)
    short, = encode(tokenizer(5), [words])  # [CLS] + 3 words + [SEP]: 5 of the 8 words dropped
    assert short == EncodedText([2, 4, 5, 6, 3], 5) and short.truncated and short.tokens == 5
    several, = encode(tokenizer(3), [words])  # 1 word per piece, 7 overflowing pieces each with its own specials
    assert several.ids == [2, 4, 3] and several.dropped_tokens == 7
    left, = encode(tokenizer(5, direction="left"), [words])
    assert left == EncodedText([2, 9, 10, 11, 3], 5)  # cut on the left: the last three words are kept
    assert unknown.ids == [2, 1, 1, 3]  # unknown words still count as tokens


def test_without_special_tokens_every_token_is_text() -> None:
    plain, = encode(tokenizer(3, special=False), ["one two three four five"])
    assert plain == EncodedText([4, 5, 6], 2)


def test_a_batch_is_right_padded_with_the_pad_id_within_max_length() -> None:
    ids, mask = pad_batch([[2, 4, 3], [2] + [5] * 25 + [3]], pad_id=9, max_length=30)
    assert ids.shape == mask.shape == (2, 30)  # 27 tokens round up to 32, cut to max_length
    assert ids[0].tolist() == [2, 4, 3] + [9] * 27 and mask[0].tolist() == [1] * 3 + [0] * 27
    assert mask[1].tolist() == [1] * 27 + [0] * 3
