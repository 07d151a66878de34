"""One artifact folder (``<model>/<version>/``): manifest validation, sha256 check, TorchScript load,
warm-up, and the manifest lookups the server needs (OOD threshold for a sample count)."""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from models.artifact_format import ARTIFACT, FORMAT_VERSION, MANIFEST, major_version, verify_files
from models.uncertainty import OOD_SCORES
from service.device import Device

REQUIRED_KEYS = ("format_version", "name", "version", "modality", "labels", "input", "sampling", "ood", "files")
SUPPORTED_MODALITIES = ("image",)


class ArtifactError(Exception):
    """The folder is not a servable artifact; the message becomes the model's ``reason``."""


@dataclass(frozen=True)
class OodRule:
    """The OOD score and threshold used for a request's sample count."""

    score: str
    threshold: float
    calibrated_samples: int  # the sample count the threshold was set at
    note: str | None = None


def read_manifest(folder: Path) -> dict[str, Any]:
    path = folder / MANIFEST
    if not path.is_file():
        raise ArtifactError(f"{MANIFEST} is missing")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ArtifactError(f"{MANIFEST} is not valid JSON: {exc}") from exc
    if not isinstance(manifest, dict):
        raise ArtifactError(f"{MANIFEST} is not a JSON object")
    return manifest


def validate_manifest(manifest: dict[str, Any]) -> None:
    missing = [key for key in REQUIRED_KEYS if key not in manifest]
    if missing:
        raise ArtifactError(f"manifest lacks {', '.join(missing)}")
    try:
        major = major_version(manifest)
    except ValueError as exc:
        raise ArtifactError(f"unreadable format_version {manifest['format_version']!r}") from exc
    if major != major_version({"format_version": FORMAT_VERSION}):
        raise ArtifactError(f"unsupported format_version {manifest['format_version']} "
                            f"(this server reads {FORMAT_VERSION.split('.')[0]}.x)")
    if manifest["modality"] not in SUPPORTED_MODALITIES:
        raise ArtifactError(f"modality {manifest['modality']!r} is not served by this build "
                            f"(supported: {', '.join(SUPPORTED_MODALITIES)})")
    if ARTIFACT not in manifest["files"]:
        raise ArtifactError(f"manifest files do not list {ARTIFACT}")
    thresholds = manifest["ood"].get("thresholds") or {}
    if not thresholds:
        raise ArtifactError("manifest ood.thresholds is empty")
    for count, entry in thresholds.items():
        if not str(count).isdigit() or entry.get("score") not in OOD_SCORES or "threshold" not in entry:
            raise ArtifactError(f"bad ood.thresholds entry {count!r}: {entry!r}")
    sampling = manifest["sampling"]
    if not 1 <= int(sampling.get("default_samples", 0)) <= int(sampling.get("max_samples", 0)):
        raise ArtifactError("sampling needs 1 <= default_samples <= max_samples")


def ood_rule(manifest: dict[str, Any], n_samples: int) -> OodRule:
    """The manifest's threshold for ``n_samples``; otherwise the nearest calibrated sample count whose score
    is defined at ``n_samples`` (mutual information needs S >= 2), said so in ``note``."""
    table = manifest["ood"]["thresholds"]
    entry = table.get(str(n_samples))
    if entry is not None:
        return OodRule(entry["score"], float(entry["threshold"]), n_samples)
    usable = [(int(k), v) for k, v in table.items() if n_samples >= 2 or v["score"] != "mutual_information"]
    if not usable:
        raise ArtifactError(f"no OOD threshold usable at n_samples={n_samples}")
    count, entry = min(usable, key=lambda kv: (abs(kv[0] - n_samples), kv[0]))
    note = (f"no threshold calibrated at n_samples={n_samples}; used the one calibrated at n_samples={count}, "
            "the nearest supported count")
    return OodRule(entry["score"], float(entry["threshold"]), count, note)


@dataclass
class Artifact:
    """A loaded, verified and warmed-up artifact."""

    folder: Path
    manifest: dict[str, Any]
    module: torch.jit.ScriptModule

    @property
    def labels(self) -> list[str]:
        return list(self.manifest["labels"])

    @property
    def input_shape(self) -> tuple[int, int, int]:
        spec = self.manifest["input"]
        return int(spec["channels"]), int(spec["height"]), int(spec["width"])

    @property
    def default_samples(self) -> int:
        return int(self.manifest["sampling"]["default_samples"])

    @property
    def max_samples(self) -> int:
        return int(self.manifest["sampling"]["max_samples"])

    @property
    def temperature(self) -> float:
        return float(self.manifest.get("temperature", 1.0))


def load_artifact(folder: Path, device: Device) -> Artifact:
    """Validate, verify and load ``folder``; raise ``ArtifactError`` with a readable reason otherwise."""
    manifest = read_manifest(folder)
    validate_manifest(manifest)
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
    warm_up(artifact, device)
    return artifact


def warm_up(artifact: Artifact, device: Device) -> None:
    """One ``sample_rows`` forward with mixed sample counts; checks the output shape."""
    channels, height, width = artifact.input_shape
    pixels = torch.zeros(2, channels, height, width, device=device.torch_device)
    repeats = torch.tensor([1, artifact.default_samples], dtype=torch.long, device=device.torch_device)
    try:
        with device.lock, torch.inference_mode(), device.autocast():
            rows = artifact.module.sample_rows(pixels, repeats)
    except Exception as exc:
        raise ArtifactError(f"warm-up forward failed: {type(exc).__name__}: {exc}") from exc
    expected = (1 + artifact.default_samples, len(artifact.labels))
    if tuple(rows.shape) != expected:
        raise ArtifactError(f"warm-up returned shape {tuple(rows.shape)}, expected {expected}")
    if not torch.isfinite(rows).all():
        raise ArtifactError("warm-up returned non-finite logits")
