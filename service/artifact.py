"""One artifact folder (``<model>/<version>/``): manifest validation, sha256 check, TorchScript load (and, for
text models, the tokenizer), warm-up (every shape bucket where the device pads to them), and the manifest lookups
the server needs (OOD threshold for a sample count, the text input section)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer

from artifact.contract import (
    ARTIFACT,
    Manifest,
    ManifestError,
    Ood,
    TextInput,
    escaping_files,
    parse_manifest,
    read_document,
    verify_files,
)
from models.uncertainty import INPUT_SCORES, KERNEL_ERROR, OOD_SCORES, SERVED_SCORES, ScoreTerm, needs_input_scores
from service.device import Device
from service.shapes import WARM_CALLS, warm_counts, warm_text_width
from service.texts import encode, pad_batch, warm_up_texts


class ArtifactError(Exception):
    """The folder is not a servable artifact; the message becomes the model's ``reason``."""


@dataclass(frozen=True)
class OodRule:
    """The OOD score and threshold used for a request's sample count."""

    score: str
    threshold: float
    calibrated_samples: int  # the sample count the threshold was set at
    note: str | None = None
    terms: tuple[ScoreTerm, ...] = ()  # the manifest's combination (score "combined")


def read_manifest(folder: Path) -> dict[str, Any]:
    """The folder's manifest as written, shown by ``GET /models`` even when the version is unavailable."""
    try:
        return read_document(folder)
    except ManifestError as exc:
        raise ArtifactError(str(exc)) from exc


def validate_manifest(document: dict[str, Any]) -> Manifest:
    """The typed manifest, if it keeps the artifact contract and names only OOD scores this server computes."""
    try:
        manifest = parse_manifest(document)
    except ManifestError as exc:
        raise ArtifactError(str(exc)) from exc
    for count, entry in manifest.ood.thresholds.items():
        if entry.score not in SERVED_SCORES:
            raise ArtifactError(f"bad ood.thresholds entry {count!r}: score {entry.score!r} is not one of "
                                f"{', '.join(SERVED_SCORES)}")
    for term in manifest.ood.combination or []:
        if term.score not in (*OOD_SCORES, *INPUT_SCORES):
            raise ArtifactError(f"bad ood.combination term: score {term.score!r} is not one of "
                                f"{', '.join((*OOD_SCORES, *INPUT_SCORES))}")
    given = set(input_score_names(manifest))
    used = {entry.score for entry in manifest.ood.thresholds.values()}
    used |= {term.score for term in manifest.ood.combination or []}
    missing = sorted((used & set(INPUT_SCORES)) - given)
    if missing:
        raise ArtifactError(f"the OOD rules use {', '.join(missing)}, which the artifact's scored_rows does not return "
                            f"(artifact.input_scores: {sorted(given)})")
    return manifest


def input_score_names(manifest: Manifest) -> tuple[str, ...]:
    """The columns of the artifact's ``scored_rows`` scores: ``artifact.input_scores``; an artifact from before
    feature-space scores returns the kernel error alone."""
    given = manifest.artifact.input_scores if manifest.artifact is not None else None
    return tuple(given or (KERNEL_ERROR,))


def score_terms(ood: Ood) -> tuple[ScoreTerm, ...]:
    """The manifest's combination as ``ScoreTerm``s (empty when it has none)."""
    return tuple(ScoreTerm(t.score, t.weight, t.center, t.scale, t.log) for t in ood.combination or [])


def uses_input_scores(manifest: Manifest) -> bool:
    """Whether any of the manifest's OOD rules reads a per-input score (the artifact's ``scored_rows``)."""
    terms = score_terms(manifest.ood)
    return any(needs_input_scores(entry.score, terms) for entry in manifest.ood.thresholds.values())


def ood_rule(ood: Ood, n_samples: int) -> OodRule:
    """The manifest's threshold for ``n_samples``; otherwise the nearest calibrated sample count whose score
    is defined at ``n_samples`` (mutual information needs S >= 2), said so in ``note``."""
    entry = ood.thresholds.get(n_samples)
    terms = score_terms(ood)
    if entry is not None:
        return OodRule(entry.score, entry.threshold, n_samples, terms=terms)
    usable = [(k, v) for k, v in ood.thresholds.items() if n_samples >= 2 or v.score != "mutual_information"]
    if not usable:
        raise ArtifactError(f"no OOD threshold usable at n_samples={n_samples}")
    count, entry = min(usable, key=lambda kv: (abs(kv[0] - n_samples), kv[0]))
    note = (f"no threshold calibrated at n_samples={n_samples}; used the one calibrated at n_samples={count}, "
            "the nearest supported count")
    return OodRule(entry.score, entry.threshold, count, note, terms)


@dataclass
class Artifact:
    """A loaded, verified and warmed-up artifact."""

    folder: Path
    manifest: Manifest
    module: torch.jit.ScriptModule
    tokenizer: Tokenizer | None = None  # text models only: truncation set from ``text``, no padding

    @cached_property
    def scored(self) -> bool:
        """Forwards call ``scored_rows`` (rows and per-input scores) instead of ``sample_rows``."""
        return uses_input_scores(self.manifest)

    @cached_property
    def input_score_names(self) -> tuple[str, ...]:
        return input_score_names(self.manifest)

    def rows(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One forward of the model inputs and ``repeats`` (last): the sampled rows [sum(repeats), C] and, when the
        OOD score needs them, every input's scores [B, F] in ``input_score_names`` order (else None)."""
        if self.scored:
            rows, scores = self.module.scored_rows(*inputs)
            return rows, scores.unsqueeze(1) if scores.dim() == 1 else scores  # a kernel error alone: [B] -> [B, 1]
        return self.module.sample_rows(*inputs), None

    def named_scores(self, scores: torch.Tensor | None) -> dict[str, torch.Tensor] | None:
        """Per-input scores [n, F] by name ([n] each), or None."""
        if scores is None:
            return None
        return {name: scores[:, i] for i, name in enumerate(self.input_score_names)}

    @property
    def text(self) -> TextInput | None:
        """Text models: the manifest's input section."""
        return self.manifest.input if isinstance(self.manifest.input, TextInput) else None

    @property
    def modality(self) -> str:
        return self.manifest.modality

    @property
    def labels(self) -> list[str]:
        return self.manifest.labels

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """Image models: (channels, height, width)."""
        spec = self.manifest.input
        if isinstance(spec, TextInput):
            raise TypeError("a text model has no input shape")
        return spec.channels, spec.height, spec.width

    @property
    def default_samples(self) -> int:
        return self.manifest.sampling.default_samples

    @property
    def max_samples(self) -> int:
        return self.manifest.sampling.max_samples

    @property
    def temperature(self) -> float:
        return self.manifest.temperature


def shown_name(name: str) -> str:
    """A file name from a manifest as an error shows it: bounded, and never an absolute path."""
    return "an absolute path" if Path(name).is_absolute() else repr(name[:100])


def load_artifact(folder: Path, device: Device) -> Artifact:
    """Validate, verify and load ``folder``; raise ``ArtifactError`` with a readable reason otherwise."""
    manifest = validate_manifest(read_manifest(folder))
    escaping = escaping_files(folder, manifest)
    if escaping:
        raise ArtifactError(f"files that resolve outside the version folder (absolute paths, '..' or symlinks may "
                            f"not leave it): {', '.join(shown_name(name) for name in escaping)}")
    bad = verify_files(folder, manifest)
    if bad:
        raise ArtifactError(f"sha256 mismatch or missing file: {', '.join(bad)}")
    try:
        with warnings.catch_warnings():
            # TorchScript is the promised artifact format; its deprecation warning is expected here
            warnings.filterwarnings("ignore", message=".*torch.jit.*", category=FutureWarning)
            warnings.filterwarnings("ignore", category=DeprecationWarning)
            module = torch.jit.load(str(folder / ARTIFACT), map_location=device.torch_device)
        module.eval()
    except Exception as exc:  # a corrupt file raises many different errors
        raise ArtifactError(f"torch.jit.load failed: {type(exc).__name__}: {exc}") from exc
    artifact = Artifact(folder, manifest, module)
    if artifact.scored and not hasattr(module, "scored_rows"):
        raise ArtifactError("the manifest's OOD score needs per-input scores but the artifact has no scored_rows")
    if artifact.text is not None:
        artifact.tokenizer = load_tokenizer(folder, artifact.text)
    warm_up(artifact, device)
    return artifact


def load_tokenizer(folder: Path, spec: TextInput) -> Tokenizer:
    """The artifact's ``tokenizers`` tokenizer, truncating as the manifest says (whatever the file says) and never
    padding (batches are padded by the server)."""
    try:
        tokenizer = Tokenizer.from_file(str(folder / spec.tokenizer))
    except Exception as exc:  # the Rust side raises plain Exceptions
        raise ArtifactError(f"{spec.tokenizer} is not a tokenizers file: {exc}") from exc
    tokenizer.no_padding()
    tokenizer.enable_truncation(spec.max_length, stride=0, strategy="longest_first", direction=spec.truncation_side)
    if tokenizer.num_special_tokens_to_add(False) >= spec.max_length:
        raise ArtifactError(f"max_length {spec.max_length} leaves no room beside the tokenizer's special tokens")
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    if spec.pad_id >= vocab:
        raise ArtifactError(f"pad_id {spec.pad_id} outside the tokenizer's vocabulary of {vocab}")
    return tokenizer


def error_line(exc: Exception) -> str:
    """A one-line reason: a TorchScript error's message holds the script's traceback, whose last line is the error."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if isinstance(exc, torch.jit.Error) and lines:
        return lines[-1]
    return f"{type(exc).__name__}: {' '.join(lines)}"


def warm_up(artifact: Artifact, device: Device) -> None:
    """One forward (``Artifact.rows``) with mixed sample counts (text: a short text and one truncated to max_length,
    padded like a served batch, so the whole position table is used); checks the output shape and values."""
    repeats = torch.tensor([1, artifact.default_samples], dtype=torch.long, device=device.torch_device)
    try:
        with device.lock, torch.inference_mode(), device.autocast():
            if artifact.text is not None:
                assert artifact.tokenizer is not None
                texts = encode(artifact.tokenizer, warm_up_texts(artifact.text.max_length))
                if texts[1].tokens != artifact.text.max_length or not texts[1].truncated:
                    raise ArtifactError(f"the tokenizer gave {texts[1].tokens} tokens for a text longer than "
                                        f"max_length {artifact.text.max_length}")
                ids, mask = pad_batch([t.ids for t in texts], artifact.text.pad_id, artifact.text.max_length)
                rows, error = artifact.rows(ids.to(device.torch_device), mask.to(device.torch_device), repeats)
            else:
                channels, height, width = artifact.input_shape
                pixels = torch.zeros(2, channels, height, width, device=device.torch_device)
                rows, error = artifact.rows(pixels, repeats)
    except ArtifactError:
        raise
    except Exception as exc:
        raise ArtifactError(f"warm-up forward failed: {error_line(exc)}") from exc
    expected = (1 + artifact.default_samples, len(artifact.labels))
    if tuple(rows.shape) != expected:
        raise ArtifactError(f"warm-up returned shape {tuple(rows.shape)}, expected {expected}")
    if not torch.isfinite(rows).all():
        raise ArtifactError("warm-up returned non-finite logits")
    columns = len(artifact.input_score_names)
    if error is not None and (tuple(error.shape) != (2, columns) or not torch.isfinite(error).all()):
        raise ArtifactError(f"warm-up returned per-input scores of shape {tuple(error.shape)} or non-finite, expected "
                            f"(2, {columns}) for artifact.input_scores {list(artifact.input_score_names)}")
    if device.shapes.buckets:
        warm_up_buckets(artifact, device)


def warm_up_buckets(artifact: Artifact, device: Device) -> None:
    """``WARM_CALLS`` forwards at every shape a served forward can be padded to (``service.shapes.warm_counts``),
    so the executor's profiling and fusion happen before the version is ready, not on live requests."""
    target = device.torch_device
    text = artifact.text
    try:
        with device.lock, torch.inference_mode(), device.autocast():
            for inputs, rows in warm_counts(device.shapes, text is not None):
                repeats = torch.full((inputs,), rows // inputs, dtype=torch.long, device=target)  # [inputs]
                if text is not None:
                    width = warm_text_width(device.shapes, rows, text.max_length)
                    ids = torch.full((inputs, width), text.pad_id, dtype=torch.long, device=target)  # [inputs, L]
                    mask = torch.ones(inputs, width, dtype=torch.long, device=target)  # [inputs, L]
                    for _ in range(WARM_CALLS):
                        artifact.rows(ids, mask, repeats)
                else:
                    pixels = torch.zeros(inputs, *artifact.input_shape, device=target)  # [inputs, C, H, W]
                    for _ in range(WARM_CALLS):
                        artifact.rows(pixels, repeats)
            if device.is_cuda:
                torch.cuda.synchronize(target)
    except Exception as exc:
        raise ArtifactError(f"warm-up of the shape buckets failed: {error_line(exc)}") from exc
