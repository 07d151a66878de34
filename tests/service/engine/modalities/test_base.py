"""What every modality shares (``service.engine.modalities.base`` and ``modality_for``): the raw inputs' counts, the
refusal of an input of another modality with what the model takes, and the defaults a decoder and a batch keep."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from service.engine.modalities import modality_for
from service.engine.modalities.base import (
    Base64Image,
    EncodedImage,
    InputBatch,
    InputDecoder,
    InputLimits,
    PixelValues,
    RawInput,
    TensorSpec,
    Text,
    article,
    item_modality,
)
from service.engine.modalities.image import ImageDecoder, ImageRunner
from service.errors import ApiError
from tests.service.engine.fakes import SHAPE, manifest

LIMITS = InputLimits(max_text_chars=100, max_image_pixels=1000, max_request_pixels=1000)


class Counted(InputBatch):
    def __init__(self, size: int) -> None:
        self.size = size


class TextOnly(InputDecoder):
    """The least a decoder must say; everything else is the base class's."""

    modality = "text"
    takes = (Text,)
    tensor = TensorSpec("text", "BYTES", (1,))

    def describe(self) -> str:
        return "a sentence"

    def decode(self, items: Sequence[RawInput], limits: InputLimits, model: str) -> InputBatch:
        self.check_kinds(items, model)
        return Counted(len(items))


def test_each_raw_input_counts_its_inputs_and_names_its_modality() -> None:
    items: list[RawInput] = [Base64Image("", ["inputs", 0]), EncodedImage(b"", ["file"]),
                             PixelValues([[0.0]], ["inputs", 1]), Text("hi", ["inputs", 2])]
    assert [item.count for item in items] == [1, 1, 1, 1]
    assert [item.kind for item in items] == ["image_base64", "image", "pixels", "text"]
    assert [item_modality(item) for item in items] == ["image", "image", "image", "text"]
    assert PixelValues(np.zeros((5, *SHAPE)), ["inputs", 0], batched=True).count == 5  # an OIP tensor's first axis
    assert (article("image"), article("text")) == ("an", "a")


def test_an_input_of_another_modality_is_422_saying_what_the_model_takes() -> None:
    decoder = TextOnly()
    assert decoder.decode([Text("hi", ["inputs", 0])], LIMITS, "m").size == 1
    with pytest.raises(ApiError) as error:
        decoder.decode([Text("hi", ["inputs", 0]), PixelValues([[0.0]], ["inputs", 1, "pixels"])], LIMITS, "reviews")
    assert error.value.status == 422 and error.value.message == (
        "1.pixels: model 'reviews' takes texts (a sentence); pixels inputs need an image model")
    assert error.value.details == [{"loc": ["inputs", 1, "pixels"], "msg": error.value.message}]
    with pytest.raises(ApiError, match="^input: model 'fashion' takes images .*; text inputs need a text model$"):
        ImageDecoder(SHAPE).check_kinds([Text("hi", ["inputs"])], "fashion")  # a location of one part


def test_the_base_defaults_a_decoder_and_a_batch_keep() -> None:
    decoder = TextOnly()
    assert decoder.parameters() == {} and decoder.max_characters(LIMITS) is None and decoder.extra_outputs == ()
    batch = Counted(3)
    assert batch.longest == 0 and dict(batch.extras) == {}
    with pytest.raises(TypeError):
        batch.extras["tokens"] = [1]  # type: ignore[index]  # shared by every batch: read-only


def test_a_manifests_modality_picks_its_decoder_and_runner(tmp_path: Path) -> None:
    modality = modality_for(manifest(), tmp_path)
    assert isinstance(modality.decoder, ImageDecoder) and isinstance(modality.runner, ImageRunner)
    assert modality.decoder.shape == modality.runner.shape == SHAPE
    with pytest.raises(ValueError, match="modality 'audio' is not one this server decodes: image, text"):
        modality_for(manifest().model_copy(update={"modality": "audio"}), tmp_path)
