"""Text models' two halves (``service.engine.modalities.text``) on a word-level tokenizer written to a temp folder:
how the artifact's tokenizer is loaded and set, what the decoder refuses and reports per text, and how the runner
prices, pads and runs batches of token ids (a recording function stands in for the model)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.normalizers import Replace
from tokenizers.pre_tokenizers import Whitespace
from tokenizers.processors import TemplateProcessing

from artifact.contract import TOKENIZER, TextInput
from service.engine.device import Device
from service.engine.modalities import text
from service.engine.modalities.base import InputLimits, PixelValues, Text
from service.engine.modalities.text import TextDecoder, TextRunner, TokenBatch, load_tokenizer, pad_tokens
from service.engine.shapes import BatchShapes, Padding
from service.engine.texts import EncodedText
from service.errors import ApiError
from tests.service.engine.fakes import manifest

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "warm", "up", "a", "b", "c", "d", "e", "f", "g", "h", "i", "j"]
LIMITS = InputLimits(max_text_chars=30, max_image_pixels=100, max_request_pixels=100)
PAD = 0


def word_tokenizer(padded_to: int | None = None) -> Tokenizer:
    """[CLS] words [SEP]; with ``padded_to``, a file that asks for padding (the server must turn it off)."""
    built = Tokenizer(WordLevel({word: i for i, word in enumerate(WORDS)}, unk_token="[UNK]"))
    built.pre_tokenizer = Whitespace()
    built.post_processor = TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    if padded_to is not None:
        built.enable_padding(pad_id=PAD, length=padded_to)
    return built


def spec(max_length: int = 8, side: str = "right", pad_id: int = PAD, max_characters: int = 50) -> TextInput:
    return TextInput.model_validate({"tokenizer": TOKENIZER, "max_length": max_length, "max_characters": max_characters,
                                     "truncation": {"side": side}, "padding": {"pad_id": pad_id}})


def saved(folder: Path, tokenizer: Tokenizer) -> Path:
    tokenizer.save(str(folder / TOKENIZER))
    return folder


def decoder(max_length: int = 8, side: str = "right") -> TextDecoder:
    tokenizer = word_tokenizer()
    tokenizer.enable_truncation(max_length, direction=side)
    return TextDecoder(spec(max_length, side), tokenizer)


def test_the_tokenizer_truncates_as_the_manifest_says_and_never_pads(tmp_path: Path) -> None:
    tokenizer = load_tokenizer(saved(tmp_path, word_tokenizer(padded_to=32)), spec(max_length=5, side="left"))
    assert tokenizer.padding is None
    encoding = tokenizer.encode("a b c d e f")
    assert encoding.ids == [2, 9, 10, 11, 3] and len(encoding.overflowing) > 0  # the last three words kept


@pytest.mark.parametrize(("write", "settings", "reason"), [
    (lambda folder: (folder / TOKENIZER).write_text(json.dumps({"model": "none"})), {},
     "tokenizer.json is not a tokenizers file"),
    (lambda folder: saved(folder, word_tokenizer()), {"pad_id": len(WORDS)}, "pad_id 16 outside the tokenizer's"),
    (lambda folder: saved(folder, word_tokenizer()), {"max_length": 2}, "leaves no room beside the tokenizer's"),
])
def test_a_tokenizer_the_server_cannot_use_is_refused_with_why(tmp_path: Path, write: Any, settings: dict[str, Any],
                                                               reason: str) -> None:
    write(tmp_path)
    with pytest.raises(ValueError, match=reason):
        load_tokenizer(tmp_path, spec(**settings))


def test_load_needs_a_text_section(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="a text model's manifest needs a text input section"):
        text.load(manifest(), tmp_path)


def test_texts_become_token_batches_reporting_tokens_and_truncation() -> None:
    batch = decoder().decode([Text("a b", ["inputs", 0]), Text("a b c d e f g h", ["inputs", 1])], LIMITS, "m")
    assert [t.ids for t in batch.texts] == [[2, 6, 7, 3], [2, 6, 7, 8, 9, 10, 11, 3]]
    assert (batch.size, batch.longest) == (2, 8)
    assert dict(batch.extras) == {"tokens": [4, 8], "truncated": [False, True], "dropped_tokens": [0, 2]}
    assert [spec.name for spec in TextDecoder.extra_outputs] == ["tokens", "truncated", "dropped_tokens"]


def test_the_character_limit_is_the_lower_of_the_manifests_and_the_servers() -> None:
    text_decoder = decoder()
    assert text_decoder.max_characters(LIMITS) == 30  # the server's, below the manifest's 50
    assert text_decoder.max_characters(InputLimits(1000, 1, 1)) == 50
    assert text_decoder.parameters() == {"max_length": 8}
    with pytest.raises(ApiError, match="text has 31 characters, the limit for this model is 30") as error:
        text_decoder.decode([Text("a " * 15 + "b", ["inputs", 0, "text"])], LIMITS, "m")
    assert error.value.status == 413


def test_inputs_the_tokenizer_cannot_read_or_of_another_modality_are_422() -> None:
    plain = Tokenizer(WordLevel({"[PAD]": 0, "[UNK]": 1, "a": 2}, unk_token="[UNK]"))
    plain.pre_tokenizer = Whitespace()
    plain.normalizer = Replace("x", "")  # a text of x's reads as nothing, with no special token to show for it
    with pytest.raises(ApiError, match="^inputs.0.text: the model's tokenizer reads no token in this text$"):
        TextDecoder(spec(), plain).decode([Text("xxx", ["inputs", 0, "text"])], LIMITS, "m")
    with pytest.raises(ApiError, match="takes texts .*; pixels inputs need an image model"):
        decoder().decode([PixelValues([[0.0]], ["inputs", 0, "pixels"])], LIMITS, "m")


def encoded(*lengths: int) -> TokenBatch:
    """Texts of ``lengths`` tokens: [CLS] then 4 + its position, repeated, then [SEP]."""
    return TokenBatch([EncodedText([2, *[4 + i] * (n - 2), 3], 0) for i, n in enumerate(lengths)])


def test_batches_join_and_part_in_order_and_cost_padded_tokens() -> None:
    runner = TextRunner(spec(max_length=32), word_tokenizer())
    joined = runner.join([encoded(3), encoded(12, 5)])
    assert [t.tokens for t in joined.texts] == [3, 12, 5] and joined.longest == 12
    part = runner.part(joined, 1, 3)
    assert part.size == 2 and part.extras["tokens"] == [12, 5]
    cost = runner.batch_cost(max_batch_samples=4, max_batch_tokens=64)  # the sample budget is for images
    assert (cost.budget, cost.setting, cost.max_rows) == (64, "max_batch_tokens", 8)
    assert cost.cost(rows=3, longest=12) == 3 * 16 and cost.cost(rows=1, longest=100) == 32


class Recorder:
    """A model whose rows for input i are ``[first real token, i]``; records every forward's inputs."""

    def __init__(self) -> None:
        self.forwards: list[tuple[torch.Tensor, torch.Tensor, list[int]]] = []

    def __call__(self, ids: torch.Tensor, mask: torch.Tensor, repeats: torch.Tensor) -> tuple[torch.Tensor, None]:
        self.forwards.append((ids, mask, repeats.tolist()))
        rows = torch.stack([ids[:, 1].float(), torch.arange(len(ids), dtype=torch.float32)], 1)  # [B, 2]
        return rows.repeat_interleave(repeats, 0), None


def test_a_forward_is_right_padded_to_its_longest_text_and_to_the_buckets() -> None:
    runner, model = TextRunner(spec(max_length=32), word_tokenizer()), Recorder()
    device = Device(torch.device("cpu"), shapes=BatchShapes(4, 64, buckets=True))
    out = runner.forward(model, device, encoded(3, 10, 4), [1, 1, 1], runner.batch_cost(4, 64), seed=None)
    (ids, mask, repeats), = model.forwards
    assert ids.shape == mask.shape == (4, 16) and repeats == [1, 1, 2, 0]  # 3 inputs -> 4, 3 rows -> 4
    assert ids[0].tolist() == [2, 4, 3] + [PAD] * 13 and mask[0].tolist() == [1] * 3 + [0] * 13
    assert ids[3].tolist() == [PAD] * 16 and mask[3].tolist() == [1] + [0] * 15  # one visible pad token, no NaN
    assert out.rows[:, 0].tolist() == [4, 5, 6] and out.scores is None  # the padding row is dropped
    assert (out.tokens, out.padded_length) == (16 * 4, 16)


def test_the_warm_up_inputs_fill_the_position_table_and_the_budget() -> None:
    tokenizer = word_tokenizer()
    tokenizer.enable_truncation(16)
    runner = TextRunner(spec(max_length=16), tokenizer)
    ids, mask = runner.example()  # "a warm-up sentence." reads as 6 words and 2 special tokens
    assert ids.shape == (2, 16) and mask.sum(1).tolist() == [8, 16]  # one short, one truncated to max_length
    runner = TextRunner(spec(max_length=32), tokenizer)
    cost = runner.batch_cost(0, 64)
    assert [runner.filler(2, rows, cost)[0].shape[1] for rows in (1, 4, 8, 64)] == [32, 16, 8, 8]
    filler_ids, filler_mask = runner.filler(3, 4, cost)
    assert filler_ids.unique().tolist() == [PAD] and filler_mask.all()


def test_padding_inputs_are_added_only_where_the_padding_asks() -> None:
    ids, mask = torch.ones(1, 8, dtype=torch.long), torch.ones(1, 8, dtype=torch.long)
    assert pad_tokens(ids, mask, Padding(1, 2, 1, 2), PAD) == (ids, mask)
