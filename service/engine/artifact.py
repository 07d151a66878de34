"""One artifact folder (``<model>/<version>/``): manifest validation, sha256 check, TorchScript (or AOTInductor
package) load, its modality's input decoder and batch runner (``service.engine.modalities``: for text models the
tokenizer), warm-up (every shape bucket where the device pads to them), and the manifest lookups the server needs (the
OOD threshold for a sample count)."""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import torch

from artifact.contract import (
    ARTIFACT,
    Manifest,
    ManifestError,
    Ood,
    ScoreTermSection,
    escaping_files,
    parse_manifest,
    read_document,
    verify_files,
)
from artifact.formats import AOTI_FORMAT, FORMATS, TORCHSCRIPT_FORMAT, artifact_format, compiled_of
from models.tasks import MULTI_LABEL
from models.uncertainty import (
    INPUT_SCORES,
    KERNEL_ERROR,
    OOD_SCORES,
    SERVED_SCORES,
    ScoreTemperature,
    ScoreTerm,
    Temperature,
    needs_input_scores,
)
from service.engine.decisions import AnswersDecisions, VersionDecisions
from service.engine.device import Device
from service.engine.exported_artifact import CannotRun, CompiledDirector, load_compiled
from service.engine.label_decisions import LabelRecallDecisions
from service.engine.modalities import modality_for
from service.engine.modalities.base import BatchRunner, InputDecoder
from service.engine.shapes import WARM_CALLS, warm_counts
from service.engine.tasks import ServedTask, served_task

log = logging.getLogger("service.engine.artifact")


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

    def relative(self, scores: list[float]) -> list[float]:
        """Each score relative to the threshold, ``1 + (score - threshold) / |threshold|``: 1 at the threshold, above
        1 exactly where the input is flagged, and on one scale whatever the score and its sign (a Mahalanobis distance
        in the hundreds, an energy below 0), so one bucket layout shows every model (docs/operations.md)."""
        scale = max(abs(self.threshold), 1e-12)
        return [1.0 + (score - self.threshold) / scale for score in scores]


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
    by_score = manifest.temperature_by_score.terms if manifest.temperature_by_score is not None else []
    for term in by_score:
        if term.score not in INPUT_SCORES:
            raise ArtifactError(f"bad temperature_by_score term: score {term.score!r} is not one of "
                                f"{', '.join(INPUT_SCORES)} (a per-input score of scored_rows)")
    given = set(input_score_names(manifest))
    missing = sorted((manifest.scores_read() & set(INPUT_SCORES)) - given)
    if missing:
        raise ArtifactError(f"the OOD rules or the temperature use {', '.join(missing)}, which the artifact's "
                            f"scored_rows does not return (artifact.input_scores: {sorted(given)})")
    return manifest


def input_score_names(manifest: Manifest) -> tuple[str, ...]:
    """The columns of the artifact's ``scored_rows`` scores: ``artifact.input_scores``; an artifact from before
    feature-space scores returns the kernel error alone."""
    given = manifest.artifact.input_scores if manifest.artifact is not None else None
    return tuple(given or (KERNEL_ERROR,))


def as_terms(sections: list[ScoreTermSection] | None) -> tuple[ScoreTerm, ...]:
    return tuple(ScoreTerm(t.score, t.weight, t.center, t.scale, t.log) for t in sections or [])


def score_terms(ood: Ood) -> tuple[ScoreTerm, ...]:
    """The manifest's combination as ``ScoreTerm``s (empty when it has none)."""
    return as_terms(ood.combination)


def manifest_temperature(manifest: Manifest) -> Temperature:
    """What the logits are divided by: the manifest's temperature, or a temperature per input when
    ``temperature_by_score`` makes it grow with a per-input score."""
    by_score = manifest.temperature_by_score
    if by_score is None:
        return manifest.temperature
    return ScoreTemperature(manifest.temperature, by_score.slope, as_terms(by_score.terms))


def uses_input_scores(manifest: Manifest) -> bool:
    """Whether any of the manifest's OOD rules or its temperature reads a per-input score (the artifact's
    ``scored_rows``)."""
    terms = score_terms(manifest.ood)
    return (manifest.temperature_by_score is not None
            or any(needs_input_scores(entry.score, terms) for entry in manifest.ood.thresholds.values()))


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
    module: torch.jit.ScriptModule | CompiledDirector  # the manifest's artifact.format
    decoder: InputDecoder  # the model's inputs: decoded from raw inputs, described to the protocols
    runner: BatchRunner  # the model's batches: joined, cut, priced, run through its forwards
    # prediction sets and abstentions (a manifest with a conformal part), or a multi-label version's label sets
    decisions: AnswersDecisions | None = None

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

    # the manifest's, read once: an artifact's manifest never changes (a new one is a new artifact)
    @cached_property
    def modality(self) -> str:
        return self.manifest.modality

    @cached_property
    def labels(self) -> list[str]:
        return self.manifest.labels

    @cached_property
    def default_samples(self) -> int:
        return self.manifest.sampling.default_samples

    @cached_property
    def max_samples(self) -> int:
        return self.manifest.sampling.max_samples

    @cached_property
    def task(self) -> ServedTask:
        """Single-label (a softmax) or multi-label (a sigmoid per label), with its calibration."""
        return served_task(self.manifest)

    @cached_property
    def temperature(self) -> Temperature:
        """One temperature, or a ``ScoreTemperature`` read per input from ``scored_rows``' scores."""
        return manifest_temperature(self.manifest)


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
    module = load_module(folder, manifest, device)
    try:
        modality = modality_for(manifest, folder)
    except ValueError as exc:
        raise ArtifactError(str(exc)) from exc
    try:
        decisions = load_decisions(folder, manifest)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        what = "label recall file" if manifest.task == MULTI_LABEL else "conformal file"
        raise ArtifactError(f"{what}: {error_line(exc)}") from exc
    artifact = Artifact(folder, manifest, module, modality.decoder, modality.runner, decisions)
    if artifact.scored and not hasattr(module, "scored_rows"):
        raise ArtifactError("the manifest's OOD score or temperature needs per-input scores but the artifact has no "
                            "scored_rows")
    warm_up(artifact, device)
    return artifact


def load_decisions(folder: Path, manifest: Manifest) -> AnswersDecisions | None:
    """The version's decisions: a multi-label version's label sets, else its prediction sets and abstentions (None
    when its manifest has neither)."""
    if manifest.task == MULTI_LABEL:
        return LabelRecallDecisions.load(folder, manifest)
    return VersionDecisions.load(folder, manifest)


def load_module(folder: Path, manifest: Manifest, device: Device) -> torch.jit.ScriptModule | CompiledDirector:
    """The module in the format the manifest names (``artifact.formats``): director.ts by default, or the AOTInductor
    package, refused with the reason when this server cannot run it."""
    kind = artifact_format(manifest.artifact)
    if kind == AOTI_FORMAT and manifest.artifact is not None:
        if manifest.artifact.file not in manifest.files:
            raise ArtifactError(f"files do not list the package {shown_name(manifest.artifact.file)} (it must be "
                                "sha256-checked)")
        try:
            package = load_compiled(folder / manifest.artifact.file, compiled_of(manifest.artifact),
                                    device.torch_device)
        except (CannotRun, ManifestError) as exc:
            raise ArtifactError(str(exc)) from exc
        log.warning("%s version %s serves its AOTInductor package: torch's runner holds Python's interpreter lock "
                    "for each whole forward, so this process reads and answers no request while a batch runs (on CPU "
                    "it serves fewer requests per second than TorchScript; docs/benchmarks-overhead.md)",
                    manifest.name, manifest.version)
        return package
    if kind != TORCHSCRIPT_FORMAT:
        raise ArtifactError(f"artifact.format {kind[:40]!r} is not a format this server runs ({', '.join(FORMATS)})")
    try:
        with warnings.catch_warnings():
            # TorchScript is the promised artifact format; its deprecation warning is expected here
            warnings.filterwarnings("ignore", message=".*torch.jit.*", category=FutureWarning)
            warnings.filterwarnings("ignore", category=DeprecationWarning)
            module = torch.jit.load(str(folder / ARTIFACT), map_location=device.torch_device)
        module.eval()
    except Exception as exc:  # a corrupt file raises many different errors
        raise ArtifactError(f"torch.jit.load failed: {type(exc).__name__}: {exc}") from exc
    return module


def error_line(exc: Exception) -> str:
    """A one-line reason: a TorchScript error's message holds the script's traceback, whose last line is the error."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if isinstance(exc, torch.jit.Error) and lines:
        return lines[-1]
    return f"{type(exc).__name__}: {' '.join(lines)}"


def warm_up(artifact: Artifact, device: Device) -> None:
    """One forward (``Artifact.rows``) of the runner's example inputs with mixed sample counts; checks the output
    shape and values."""
    target = device.torch_device
    repeats = torch.tensor([1, artifact.default_samples], dtype=torch.long, device=target)
    try:
        with device.lock, torch.inference_mode(), device.autocast():
            inputs = tuple(tensor.to(target) for tensor in artifact.runner.example())
            rows, error = artifact.rows(*inputs, repeats)
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
    """``WARM_CALLS`` forwards at every shape a served forward can be padded to (``service.engine.shapes.warm_counts``),
    so the executor's profiling and fusion happen before the version is ready, not on live requests."""
    target = device.torch_device
    cost = artifact.runner.batch_cost(device.shapes.max_batch_samples, device.shapes.max_batch_tokens)
    try:
        with device.lock, torch.inference_mode(), device.autocast():
            for inputs, rows in warm_counts(cost.max_rows):
                repeats = torch.full((inputs,), rows // inputs, dtype=torch.long, device=target)  # [inputs]
                filler = tuple(tensor.to(target) for tensor in artifact.runner.filler(inputs, rows, cost))
                for _ in range(WARM_CALLS):
                    artifact.rows(*filler, repeats)
            if device.is_cuda:
                torch.cuda.synchronize(target)
    except Exception as exc:
        raise ArtifactError(f"warm-up of the shape buckets failed: {error_line(exc)}") from exc
