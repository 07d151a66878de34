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

Unknown keys and wrong types are refused; the model's versions are then unavailable with the file's error as their
reason (``GET /models``), and an edit of the file reloads them at the next scan."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from service.engine.shapes import BatchShapes

CONFIG_FILE = "config.yaml"


class VersionPolicy(BaseModel):
    """Which version folders are served: the ``latest`` N (numeric versions, highest first), a ``specific`` list, or
    ``all`` of them."""

    model_config = ConfigDict(extra="forbid")
    latest: int | None = Field(None, ge=1)
    specific: list[str | int] | None = Field(None, min_length=1)
    all: dict[str, Any] | None = None

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

    model_config = ConfigDict(extra="forbid", strict=True)
    max_batch_samples: int | None = Field(None, ge=1)
    max_batch_tokens: int | None = Field(None, ge=8)
    max_batch_delay_ms: float | None = Field(None, ge=0)
    max_queue: int | None = Field(None, ge=1)
    request_timeout_s: float | None = Field(None, gt=0)
    default_samples: int | None = Field(None, ge=1)
    max_samples: int | None = Field(None, ge=1)
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


def read_config(model_dir: Path) -> ModelConfigFile | None:
    """The model's ``config.yaml``, or None when it has none; ``ValueError`` naming the key when it is invalid."""
    path = model_dir / CONFIG_FILE
    if not path.is_file():
        return None
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
        return ModelConfigFile.model_validate(document or {})
    except yaml.YAMLError as exc:
        raise ValueError(f"{CONFIG_FILE} is not YAML: {str(exc).splitlines()[0]}") from exc
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, error['loc'])) or 'file'}: {error['msg']}" for error in exc.errors())
        raise ValueError(f"{CONFIG_FILE}: {problems}") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{CONFIG_FILE} cannot be read: {exc}") from exc


def serving_settings(file: ModelConfigFile | None, shapes: BatchShapes, max_batch_delay_ms: float, max_queue: int,
                     request_timeout_s: float) -> ServingSettings:
    """The server-wide values (the device's batch budgets and the settings), with the file's over them."""
    given = file.given() if file is not None else {}
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
