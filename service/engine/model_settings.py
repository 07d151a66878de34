"""Per-model settings: an optional ``config.yaml`` beside a model's version folders
(``model_repository/<name>/config.yaml``) overrides the server-wide batching, sample and instance settings for that
model and chooses which of its versions are served, as Triton users expect of a model's own configuration.

    max_batch_samples: 64        # sampled rows per forward (image models)
    max_batch_tokens: 8192       # padded tokens x samples per forward (text models)
    max_batch_delay_ms: 2
    max_queue: 128
    request_timeout_s: 10
    default_samples: 4           # at most max_samples
    max_samples: 16              # at most the manifest's sampling.max_samples
    instances: 2                 # batch workers per version, each running its own forwards
    version_policy: {latest: 2}  # or {specific: [1, 3]}, or {all: {}} (the default)

Unknown keys, wrong types and values out of their bounds (every number finite) are refused; so is a file over
``MAX_CONFIG_BYTES``, nested deeper than ``MAX_CONFIG_DEPTH``, using YAML aliases (a few bytes of aliases expand to
millions of nodes), empty, or a symlink that leaves the repository. The model's versions that are not serving are then
unavailable with the file's error as their reason, one that serves keeps its last good settings and says why it did
not change (``GET /models``), and an edit of the file reloads them at the next scan."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from service.engine.shapes import BatchShapes

CONFIG_FILE = "config.yaml"
MAX_CONFIG_BYTES = 64 * 1024  # a full config is a few hundred bytes
MAX_CONFIG_DEPTH = 8  # the deepest valid key, version_policy.specific's items, is at depth 3
MAX_SPECIFIC_VERSIONS = 1000


class BoundedLoader(yaml.SafeLoader):
    """``yaml.safe_load`` without aliases and with bounded nesting: the composer recurses once per level, so a deep
    list would raise RecursionError, and an alias bomb expands a few hundred bytes into millions of nodes."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            raise yaml.composer.ComposerError(None, None, "aliases (*name) are not allowed", mark)
        self.depth += 1
        try:
            if self.depth > MAX_CONFIG_DEPTH:
                raise yaml.composer.ComposerError(None, None, f"nested deeper than {MAX_CONFIG_DEPTH} levels",
                                                  self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


class VersionPolicy(BaseModel):
    """Which version folders are served: the ``latest`` N (numeric versions, highest first), a ``specific`` list, or
    ``all`` of them."""

    model_config = ConfigDict(extra="forbid", strict=True)  # a YAML true or 1.0 is no version number
    latest: int | None = Field(None, ge=1, le=MAX_SPECIFIC_VERSIONS)
    specific: list[str | int] | None = Field(None, min_length=1, max_length=MAX_SPECIFIC_VERSIONS)
    all: dict[str, Any] | None = Field(None, max_length=0)

    @field_validator("specific")
    @classmethod
    def _version_numbers(cls, versions: list[str | int] | None) -> list[str | int] | None:
        """Triton's versions are whole numbers (its config and gRPC carry them as int64)."""
        for version in versions or []:
            text = str(version)
            if isinstance(version, bool) or not text.isdigit() or not text.isascii() or len(text) > 18:
                raise ValueError(f"{version!r} is not a version number (a whole number, as Triton's versions are)")
        return versions

    @model_validator(mode="after")
    def _one(self) -> VersionPolicy:
        if sum(value is not None for value in (self.latest, self.specific, self.all)) != 1:
            raise ValueError("give exactly one of latest, specific and all")
        return self

    def triton(self) -> dict[str, Any]:
        """Triton's JSON for the policy."""
        if self.latest is not None:
            return {"latest": {"num_versions": self.latest}}
        if self.specific is not None:
            return {"specific": {"versions": [str(version) for version in self.specific]}}
        return {"all": {}}

    def selects(self, versions: list[str], key: Any) -> set[str]:
        if self.specific is not None:
            return {str(version) for version in self.specific} & set(versions)
        if self.latest is not None:
            return set(sorted(versions, key=key, reverse=True)[:self.latest])
        return set(versions)


class ModelConfigFile(BaseModel):
    """What a model's ``config.yaml`` may set; anything it leaves out keeps the server-wide setting."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
    max_batch_samples: int | None = Field(None, ge=1, le=1 << 20)
    max_batch_tokens: int | None = Field(None, ge=8, le=1 << 24)
    max_batch_delay_ms: float | None = Field(None, ge=0, le=1000)
    max_queue: int | None = Field(None, ge=1, le=1 << 20)
    request_timeout_s: float | None = Field(None, gt=0, le=3600)
    default_samples: int | None = Field(None, ge=1, le=4096)
    max_samples: int | None = Field(None, ge=1, le=4096)
    instances: int | None = Field(None, ge=1, le=16)
    version_policy: VersionPolicy | None = None

    @model_validator(mode="after")
    def _samples(self) -> ModelConfigFile:
        if None not in (self.default_samples, self.max_samples) and self.default_samples > self.max_samples:
            raise ValueError(f"default_samples {self.default_samples} is above max_samples {self.max_samples}")
        return self

    def given(self) -> dict[str, Any]:
        """The keys the file sets, as written."""
        return self.model_dump(exclude_none=True, mode="json")


@dataclass(frozen=True)
class ServingSettings:
    """What one model is served with: the server's settings with its ``config.yaml`` over them."""

    max_batch_samples: int
    max_batch_tokens: int
    max_batch_delay_ms: float
    max_queue: int
    request_timeout_s: float
    instances: int
    default_samples: int | None  # None: the manifest's
    max_samples: int | None  # None: the manifest's
    version_policy: dict[str, Any]  # Triton's JSON form

    def shown(self) -> dict[str, Any]:
        return asdict(self)


def read_config(model_dir: Path, root: Path | None = None) -> ModelConfigFile | None:
    """The model's ``config.yaml``, or None when it has none; ``ValueError`` saying why when it cannot be used. A
    symlink must resolve inside ``root`` (default: the repository, the model folder's parent)."""
    path = model_dir / CONFIG_FILE
    if not path.is_symlink() and not path.exists():
        return None
    try:
        resolved = path.resolve(strict=True)
        if not resolved.is_relative_to((root or model_dir.parent).resolve()):
            raise ValueError(f"{CONFIG_FILE} links outside the model repository")
        with resolved.open("rb") as stream:
            raw = stream.read(MAX_CONFIG_BYTES + 1)
        if len(raw) > MAX_CONFIG_BYTES:
            raise ValueError(f"{CONFIG_FILE} is larger than {MAX_CONFIG_BYTES // 1024} KiB")
        document = yaml.load(raw.decode("utf-8"), Loader=BoundedLoader)  # a SafeLoader
        if document is None:
            raise ValueError(f"{CONFIG_FILE} is empty (write {{}} for no overrides)")
        return ModelConfigFile.model_validate(document)
    except yaml.YAMLError as exc:
        raise ValueError(f"{CONFIG_FILE} is not YAML: {' '.join(str(exc).split())[:300]}") from exc
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, error['loc'])) or 'file'}: {error['msg']}" for error in exc.errors())
        raise ValueError(f"{CONFIG_FILE}: {problems[:1000]}") from exc
    except (OSError, UnicodeDecodeError, RuntimeError) as exc:  # RuntimeError: a symlink loop on Python < 3.13
        raise ValueError(f"{CONFIG_FILE} cannot be read: {type(exc).__name__}") from exc


def serving_settings(file: ModelConfigFile | None, shapes: BatchShapes, max_batch_delay_ms: float, max_queue: int,
                     request_timeout_s: float) -> ServingSettings:
    """The server-wide values (the device's batch budgets and the settings), with the file's over them."""
    given = file.given() if file is not None else {}
    delay, timeout = given.get("max_batch_delay_ms", max_batch_delay_ms), given.get("request_timeout_s",
                                                                                      request_timeout_s)
    if ("max_batch_delay_ms" in given or "request_timeout_s" in given) and delay >= 1000 * timeout:
        raise ValueError(f"{CONFIG_FILE}: max_batch_delay_ms {delay:g} leaves no time within request_timeout_s "
                         f"{timeout:g}: every request would time out")
    return ServingSettings(
        max_batch_samples=given.get("max_batch_samples", shapes.max_batch_samples),
        max_batch_tokens=given.get("max_batch_tokens", shapes.max_batch_tokens),
        max_batch_delay_ms=given.get("max_batch_delay_ms", max_batch_delay_ms),
        max_queue=given.get("max_queue", max_queue),
        request_timeout_s=given.get("request_timeout_s", request_timeout_s),
        instances=given.get("instances", 1),
        default_samples=given.get("default_samples"),
        max_samples=given.get("max_samples"),
        version_policy=file.version_policy.triton() if file is not None and file.version_policy else {"all": {}})


def check_sampling(serving: ServingSettings, manifest_default: int, manifest_max: int) -> None:
    """``ValueError`` when the file's sample counts do not fit the artifact's manifest."""
    if serving.max_samples is not None and serving.max_samples > manifest_max:
        raise ValueError(f"{CONFIG_FILE}: max_samples {serving.max_samples} is above the manifest's "
                         f"sampling.max_samples {manifest_max}")
    highest = serving.max_samples or manifest_max
    default = serving.default_samples or manifest_default
    if default > highest:
        raise ValueError(f"{CONFIG_FILE}: the default sample count {default} is above max_samples {highest}")
