"""What a client sends, whatever the protocol (raw inputs), and the two jobs one modality does for a model
(docs/architecture.md, "The server's parts"):

- ``InputDecoder``: turns raw inputs into the batch the model takes (in the decode pool) and describes the model's
  input tensor to the protocols (OIP metadata, Triton's config, error messages);
- ``BatchRunner``: joins and cuts decoded batches, prices them against the batch budget and runs the model's forwards
  on them (in the batch worker), and gives the warm-up its inputs.

Both are built once, when an artifact loads, from its manifest's modality (``service.engine.modalities``). Nothing
outside the modality modules asks which modality a model has."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar

import torch

from service.engine.batch_cost import BatchCost
from service.engine.device import Device
from service.errors import invalid

Loc = list[str | int]  # where an input was in the request, for error details


@dataclass(frozen=True)
class Base64Image:
    """A PNG or JPEG as a JSON request sends it (``image_base64``)."""

    data: str
    loc: Loc
    kind: ClassVar[str] = "image_base64"
    count: ClassVar[int] = 1


@dataclass(frozen=True)
class EncodedImage:
    """PNG or JPEG bytes (a multipart upload, an image file)."""

    data: bytes
    loc: Loc
    kind: ClassVar[str] = "image"
    count: ClassVar[int] = 1


@dataclass(frozen=True)
class PixelValues:
    """Numbers meant as pixels in [0, 1]: one input (a nested JSON list) or, with ``batched``, a tensor of inputs
    along its first axis (an OIP tensor, already checked against its datatype)."""

    values: Any  # nested lists of numbers, or a numpy array
    loc: Loc
    batched: bool = False
    kind: ClassVar[str] = "pixels"

    @property
    def count(self) -> int:
        return len(self.values) if self.batched else 1


@dataclass(frozen=True)
class Text:
    text: str
    loc: Loc
    kind: ClassVar[str] = "text"
    count: ClassVar[int] = 1


RawInput = Base64Image | EncodedImage | PixelValues | Text


@dataclass(frozen=True)
class InputLimits:
    """The server's bounds on what one request's inputs may hold."""

    max_text_chars: int
    max_image_pixels: int
    max_request_pixels: int


@dataclass(frozen=True)
class TensorSpec:
    """One per-input tensor as the protocols describe it: OIP datatype and the dims of one input (no batch axis)."""

    name: str
    datatype: str  # OIP: FP32, BYTES, BOOL, INT64
    dims: tuple[int, ...]
    accepted: tuple[str, ...] = ()  # further datatypes a request may send for this input
    layout: str | None = None  # Triton's ``format`` of an input that has one (FORMAT_NCHW)


# what a runner runs: one forward of model inputs and ``repeats`` (last) -> rows [sum(repeats), C] and the per-input
# scores [B, F] or None (``service.engine.artifact.Artifact.rows``)
RowsFunction = Callable[..., tuple[torch.Tensor, torch.Tensor | None]]


class InputBatch:
    """Decoded inputs of one request, or of several joined into one batch. What the batching worker and the predictor
    read of it are facts fixed when the batch is built (attributes, not computed on each read):

    - ``size``: inputs;
    - ``longest``: what the batch cost's width counts of the widest input (tokens of the longest text; 0 when inputs
      have no width);
    - ``extras``: per-input facts the responses report beside the prediction, by output name
      (``InputDecoder.extra_outputs``)."""

    size: int
    longest: int = 0
    extras: Mapping[str, list[Any]] = MappingProxyType({})


@dataclass(frozen=True)
class Forward:
    """A batch's forwards: rows [sum(repeats), C] fp32 on the host, grouped by input in order, and the per-input
    scores [n, F] (or None)."""

    rows: torch.Tensor
    scores: torch.Tensor | None
    tokens: int | None = None  # text models: padded tokens x samples run, shape-bucket padding included
    padded_length: int | None = None  # text models: the width the batch was padded to


class InputDecoder(ABC):
    """One model's inputs as clients send them: decoded into its batches, described to the protocols."""

    modality: ClassVar[str]
    takes: ClassVar[tuple[type, ...]]  # the raw input types this decoder decodes
    extra_outputs: ClassVar[tuple[TensorSpec, ...]] = ()  # per-input outputs besides the prediction's
    tensor: TensorSpec  # the protocols' input tensor

    def parameters(self) -> dict[str, Any]:
        """What Triton's model config reports of the input besides its tensor."""
        return {}

    def max_characters(self, limits: InputLimits) -> int | None:
        """The longest text this server accepts for the model (None: it takes no text)."""
        return None

    def check_kinds(self, items: Sequence[RawInput], model: str) -> None:
        """422 for an input of another modality, naming what the model takes."""
        for item in items:
            if not isinstance(item, self.takes):
                where = ".".join(str(part) for part in item.loc[1:]) or "input"
                raise invalid(f"{where}: model {model!r} takes {self.modality}s ({self.describe()}); {item.kind} "
                              f"inputs need {article(item_modality(item))} {item_modality(item)} model", item.loc)

    @abstractmethod
    def describe(self) -> str:
        """What an input of this model is, for error messages."""

    @abstractmethod
    def decode(self, items: Sequence[RawInput], limits: InputLimits, model: str) -> InputBatch:
        """The inputs as the model takes them; CPU-bound (the decode pool runs it)."""


class BatchRunner(ABC):
    """One model's decoded batches: joined, cut, priced against the batch budget and run through its forwards."""

    @abstractmethod
    def join(self, batches: Sequence[InputBatch]) -> InputBatch:
        """Several requests' inputs as one batch, in order."""

    @abstractmethod
    def part(self, batch: InputBatch, start: int, stop: int) -> InputBatch:
        """Inputs ``start:stop`` of ``batch``, in order (a request run one batch-sized part at a time)."""

    @abstractmethod
    def batch_cost(self, max_batch_samples: int, max_batch_tokens: int) -> BatchCost:
        """What a batch of this model costs against its budget (which of the two budgets it uses)."""

    @abstractmethod
    def forward(self, model: RowsFunction, device: Device, batch: InputBatch, repeats: list[int], cost: BatchCost,
                seed: int | None) -> Forward:
        """The batch's sampled rows, in forwards within the budget (``service.engine.inference``)."""

    @abstractmethod
    def example(self) -> tuple[torch.Tensor, ...]:
        """Model inputs of two inputs for the warm-up forward (host tensors, no ``repeats``)."""

    @abstractmethod
    def filler(self, inputs: int, rows: int, cost: BatchCost) -> tuple[torch.Tensor, ...]:
        """Model inputs of ``inputs`` inputs at the widest shape a forward of ``rows`` rows can have (host tensors):
        the shape-bucket warm-up."""


@dataclass(frozen=True)
class Modality:
    """A model's two halves of its modality, built together from its manifest and version folder."""

    decoder: InputDecoder
    runner: BatchRunner


MODALITY_OF = {Base64Image: "image", EncodedImage: "image", PixelValues: "image", Text: "text"}


def item_modality(item: RawInput) -> str:
    return MODALITY_OF[type(item)]


def article(word: str) -> str:
    return "an" if word[:1] in "aeiou" else "a"
