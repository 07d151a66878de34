"""The artifact contract (``model_repository/<name>/<version>/``): file names, the manifest schema and its format
version, the staging rule of the exporter and the sha256 check of every file.

The exporter builds a ``Manifest`` and writes ``Manifest.document()``; the server reads the same type back with
``parse_manifest``, which names the field that breaks the contract. Sections allow keys this schema does not list,
so a newer minor format version (which may add keys) still loads, and a manifest round-trips key for key.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    Field,
    PositiveInt,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)

from artifact.conformal import Conformal as Conformal
from artifact.multi_label import MultiLabel as MultiLabel
from artifact.section import Section as Section  # re-exported: the contract's readers import them from here
from artifact.verdict import KernelVerdict as KernelVerdict
from artifact.verdict import VerdictComparison as VerdictComparison

# a minor version only adds keys (1.1 combination, scored_rows; 1.2 input_scores; 1.3 token_correlation, depth alone;
# 1.4 temperature_by_score; 1.5 posthoc, kernel_verdict; 1.6 conformal; 1.7 multi_label; 1.8 its recall; 1.9 hybrid)
FORMAT_VERSION = "1.9"
MANIFEST = "manifest.json"
ARTIFACT = "director.ts"
TOKENIZER = "tokenizer.json"


# files -------------------------------------------------------------------------------------------------------------
def sha256_file(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def staging_folder(version_dir: Path) -> Path:
    """Where the exporter writes a new version before renaming it to ``version_dir``: a hidden sibling, so a polling
    server never sees a half-written version."""
    return version_dir.with_name(f".{version_dir.name}.tmp")


def retired_folder(version_dir: Path) -> Path:
    """Where an exporter moves the version it replaces, for the moment between its two renames."""
    return version_dir.with_name(f".{version_dir.name}.old")


def is_published(folder: Path) -> bool:
    """Whether a model or version folder is for serving: hidden folders are staged or retired versions."""
    return folder.is_dir() and not folder.name.startswith(".")


# the manifest ------------------------------------------------------------------------------------------------------
def major_version(format_version: str) -> int:
    return int(str(format_version).split(".")[0])


def _known_major(format_version: str) -> str:
    try:
        major = major_version(format_version)
    except ValueError:
        raise ValueError(f"unreadable format_version {format_version!r}") from None
    if major != (ours := major_version(FORMAT_VERSION)):
        raise ValueError(f"unsupported format_version {format_version} (this build reads {ours}.x)")
    return format_version


class ImageConvert(Section):
    color: str  # PIL mode inputs are converted to: "L" or "RGB"
    resize: str
    note: str | None = None


class ImageInput(Section):
    channels: PositiveInt
    height: PositiveInt
    width: PositiveInt
    dtype: Literal["float32"] = "float32"
    range: tuple[float, float] = (0.0, 1.0)
    layout: Literal["NCHW"] = "NCHW"
    convert: ImageConvert | None = None


class Truncation(Section):
    side: Literal["left", "right"] = "right"
    characters: str | None = None
    tokens: str | None = None


class Padding(Section):
    side: str = "right"
    pad_id: int = Field(ge=0, strict=True)
    note: str | None = None

    @field_validator("side")
    @classmethod
    def _right_only(cls, side: str) -> str:
        if side != "right":
            raise ValueError(f"is {side!r}: pad on the right only (positions are absolute)")
        return side


class TextInput(Section):
    """Texts are cut to ``max_characters``, tokenised with ``tokenizer`` (a file listed, and so sha256-checked, in
    ``files``), truncated to ``max_length`` tokens (special tokens included) and right-padded with ``pad_id``."""

    tokenizer: str = Field(min_length=1)
    max_length: int = Field(ge=2, strict=True)  # room for [CLS] and [SEP]
    max_characters: int = Field(ge=1, strict=True)
    truncation: Truncation = Truncation()
    padding: Padding
    dtype: Literal["int64"] = "int64"
    fields: list[str] = ["input_ids", "attention_mask"]

    @property
    def pad_id(self) -> int:
        return self.padding.pad_id

    @property
    def truncation_side(self) -> str:
        return self.truncation.side


INPUT_SECTIONS: dict[str, type[ImageInput] | type[TextInput]] = {"image": ImageInput, "text": TextInput}


class Sampling(Section):
    depth: int | None = None  # K, the kernel steps per sample (0: no sampling, a baseline)
    steps: int | None = None  # the depth under its earlier name, in manifests written before ``depth``; read as depth
    backbone_steps: int | None = None
    prefix_transitions: int | None = None
    default_samples: int = Field(ge=1)
    max_samples: int = Field(ge=1)
    noise_scale: float | None = None
    token_correlation: float | None = Field(default=None, ge=0, le=1)  # how much of a sample's noise tokens share

    @model_validator(mode="after")
    def _default_within_max(self) -> Sampling:
        if self.default_samples > self.max_samples:
            raise ValueError("needs 1 <= default_samples <= max_samples")
        if self.steps is not None and self.depth not in (None, self.steps):
            raise ValueError(f"steps ({self.steps}) and depth ({self.depth}) name the same number and differ")
        self.__dict__["depth"] = self.steps if self.depth is None else self.depth  # not marked set: written as read
        return self


class Variance(Section):
    observed_variance: str
    tau: float
    floors: list[float]
    tau_selection_accuracy: dict[str, float] | None = None


class OodThreshold(Section):
    score: str
    threshold: float


class ScoreTermSection(Section):
    """One term of the ``combined`` OOD score: ``weight * (f(score) - center) / scale``, f = log when ``log``."""

    score: str
    weight: float
    center: float
    scale: float = Field(gt=0)
    log: bool = False


class Ood(Section):
    score: str | None = None
    fallback_score: str | None = None  # for sample counts where ``score`` is undefined (mutual information at S=1)
    tpr: float | None = None
    thresholds: dict[PositiveInt, OodThreshold] = Field(min_length=1)  # sample count -> rule (JSON keys: strings)
    combination: list[ScoreTermSection] | None = None  # the terms of the score "combined"
    selection_set: str | None = None
    selection_auroc: dict[str, float | None] | None = None
    selection_choice: str | None = None  # the chosen entry of selection_auroc

    @model_validator(mode="after")
    def _combination_when_combined(self) -> Ood:
        if any(entry.score == "combined" for entry in self.thresholds.values()) and not self.combination:
            raise ValueError("a threshold uses the score 'combined' but ood.combination lists no terms")
        return self


class TemperatureByScore(Section):
    """A temperature per input (1.4): ``temperature * exp(slope * max(0, z))``, z the sum of the terms over the
    artifact's per-input scores (``scored_rows``), so inputs that look off-distribution get softer probabilities
    (``models.uncertainty.ScoreTemperature``). Absent: one temperature for every input."""

    slope: float = Field(ge=0)
    terms: list[ScoreTermSection] = Field(min_length=1)
    fitted_on: str | None = None  # what the slope was chosen on (validation and a held-out shift)
    fit: dict[str, Any] | None = None  # every slope tried, its NLLs and the rule's verdict


class Reference(Section):
    """Validation statistics at the default sample count, the baseline of the drift gauges."""

    split: str | None = None
    n_samples: int | None = None
    n_inputs: int | None = None
    accuracy: float | None = None
    ece: float | None = None
    nll: float | None = None
    quantile_levels: list[float] | None = None
    confidence_quantiles: list[float] | None = None
    predictive_entropy_quantiles: list[float] | None = None
    mutual_information_quantiles: list[float] | None = None
    confidence_deciles: list[float] | None = None
    ood_rate: float | None = None


class ArtifactInfo(Section):
    file: str = ARTIFACT
    format: str = "torchscript"
    torch: str | None = None
    forward: str | None = None
    sample_rows: str | None = None
    scored_rows: str | None = None  # DIRECTOR with the backbone's last transitions: rows and per-input scores
    # the columns of scored_rows' per-input scores [B, F] in order (1.2); absent: the kernel error alone, shape [B]
    input_scores: list[str] | None = None
    parameters: int | None = None


class SampleCountNll(Section):
    """Validation NLL at one sample count, paired against the largest count measured (the default's evidence)."""

    nll: float
    minus_reference: float  # mean per-input NLL difference to the reference count
    stderr: float = Field(ge=0)  # its standard error


class Provenance(Section):
    backbone: dict[str, Any] | None = None
    dataset: str | None = None
    config: str | None = None
    seed: int | None = None
    git_commit: str | None = None
    date: str | None = None
    test_metrics: dict[str, Any] | None = None
    default_samples_nll: dict[PositiveInt, SampleCountNll] | None = None  # sample count -> validation NLL


class FileDigest(Section):
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    bytes: int | None = None


def scores_read(ood: Ood, temperature_by_score: TemperatureByScore | None) -> set[str]:
    """Every score the OOD rules (each S's, ``combined``'s terms) and the temperature read: ``scored_rows``'s own."""
    by_score = temperature_by_score.terms if temperature_by_score is not None else []
    return {e.score for e in ood.thresholds.values()} | {t.score for t in [*(ood.combination or []), *by_score]}


class Manifest(Section):
    """``manifest.json``; ``input`` is read as the section of the manifest's ``modality``."""

    format_version: Annotated[str, AfterValidator(_known_major)]
    name: str = Field(min_length=1)
    version: str = Field(min_length=1)
    method: Literal["director", "hybrid", "posthoc", "deterministic", "mc_dropout", "ensemble", "kep_svgp"] = "director"
    modality: Literal["image", "text"]
    labels: list[str] = Field(min_length=1)  # index = class
    task: Literal["single_label", "multi_label"] = "single_label"  # softmax over labels, or a sigmoid each (1.7)
    multi_label: MultiLabel | None = None  # a multi-label version's thresholds and temperatures (1.7)
    input: ImageInput | TextInput
    sampling: Sampling
    variance: Variance | None = None
    temperature: float = Field(1.0, gt=0)  # divides every sampled logit row
    temperature_by_score: TemperatureByScore | None = None  # the temperature per input, when it grows with a score
    ood: Ood
    reference: Reference | None = None
    kernel_verdict: KernelVerdict | None = None  # whether the kernel earns its place on this model (1.5)
    conformal: Conformal | None = None  # prediction sets and abstentions: the calibration split's scores (1.6)
    artifact: ArtifactInfo | None = None
    provenance: Provenance | None = None
    files: dict[str, FileDigest]  # every file of the folder but the manifest (``file_digests``)

    @field_validator("input", mode="wrap")
    @classmethod
    def _section_of_modality(cls, value: Any, handler: ValidatorFunctionWrapHandler, info: ValidationInfo) -> Any:
        kind = INPUT_SECTIONS.get(info.data.get("modality", ""))
        if kind is None:  # the modality's own error says what is wrong
            return value
        return handler(value) if isinstance(value, kind) else kind.model_validate(value)

    def scores_read(self) -> set[str]:
        """Every score the OOD rules (each sample count's, and the terms of ``combined``) and the temperature read."""
        return scores_read(self.ood, self.temperature_by_score)

    @model_validator(mode="after")
    def _files_listed(self) -> Manifest:
        if ARTIFACT not in self.files:
            raise ValueError(f"files do not list {ARTIFACT}")
        if isinstance(self.input, TextInput) and self.input.tokenizer not in self.files:
            raise ValueError(f"files do not list the tokenizer {self.input.tokenizer!r} (it must be sha256-checked)")
        recall = self.multi_label.recall if self.multi_label is not None else None
        if recall is not None and recall.file not in self.files:
            raise ValueError(f"files do not list {recall.file} (it must be sha256-checked)")
        return self

    @model_validator(mode="after")
    def _task_sections(self) -> Manifest:
        if self.task == "single_label":
            if self.multi_label is not None:
                raise ValueError("multi_label is for task multi_label only")
            return self
        if self.multi_label is None:
            raise ValueError("task multi_label needs the multi_label section (its thresholds)")
        if len(self.multi_label.thresholds) != len(self.labels):
            raise ValueError(f"{len(self.multi_label.thresholds)} multi_label thresholds for {len(self.labels)} labels")
        if self.conformal is not None:
            raise ValueError("conformal prediction sets are for single-label models; a multi-label version has none")
        return self


class ManifestError(ValueError):
    """The manifest breaks the contract; the message names the field and what is wrong."""


def _describe(exc: ValidationError) -> str:
    errors = exc.errors(include_url=False)

    def where(error: Any) -> str:
        return ".".join(str(part) for part in error["loc"])

    def what(error: Any) -> str:
        return str(error["ctx"]["error"]) if error["type"] == "value_error" else str(error["msg"])

    version = [e for e in errors if e["loc"] == ("format_version",) and e["type"] == "value_error"]
    if version:  # another major version: its other differences are expected
        return what(version[0])
    missing = [where(e) for e in errors if e["type"] == "missing"]
    if missing:
        return f"manifest lacks {', '.join(missing)}"
    return "; ".join(f"manifest {where(e)}: {what(e)}" if e["loc"] else f"manifest {what(e)}" for e in errors[:3])


def parse_manifest(document: Any) -> Manifest:
    """The typed manifest of a JSON document; ``ManifestError`` names what breaks the contract."""
    if not isinstance(document, dict):
        raise ManifestError(f"{MANIFEST} is not a JSON object")
    try:
        return Manifest.model_validate(document)
    except ValidationError as exc:
        raise ManifestError(_describe(exc)) from None


def read_document(folder: Path) -> dict[str, Any]:
    """The folder's manifest as written (shown as is, even when it breaks the contract)."""
    path = folder / MANIFEST
    if not path.is_file():
        raise ManifestError(f"{MANIFEST} is missing")
    try:
        document = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ManifestError(f"{MANIFEST} is not valid JSON: {exc}") from exc
    if not isinstance(document, dict):
        raise ManifestError(f"{MANIFEST} is not a JSON object")
    return document


def file_digests(directory: Path) -> dict[str, FileDigest]:
    """The sha256 and size of every file in ``directory`` except the manifest: the manifest's ``files``."""
    return {p.name: FileDigest(sha256=sha256_file(p), bytes=p.stat().st_size)
            for p in sorted(directory.iterdir()) if p.is_file() and p.name != MANIFEST}


def named_files(manifest: Manifest) -> list[str]:
    """Every file the manifest names: its ``files`` entries, the TorchScript file and a text model's tokenizer."""
    names = [*manifest.files, ARTIFACT]
    if isinstance(manifest.input, TextInput):
        names.append(manifest.input.tokenizer)
    return list(dict.fromkeys(names))


def escaping_files(directory: Path, manifest: Manifest) -> list[str]:
    """The names among ``named_files`` that do not resolve, after symlinks, inside ``directory``: an absolute path,
    a ``..`` that climbs out, or a link to a file elsewhere. Such a version is refused: the folder is the unit that
    is checked, trusted and published, so nothing it names may live outside it."""
    real = directory.resolve()
    return [name for name in named_files(manifest)
            if Path(name).is_absolute() or not (directory / name).resolve().is_relative_to(real)]


def verify_files(directory: Path, manifest: Manifest) -> list[str]:
    """Names of the manifest's files that are missing or whose sha256 differs."""
    return [name for name, entry in manifest.files.items()
            if not (directory / name).is_file() or sha256_file(directory / name) != entry.sha256]
