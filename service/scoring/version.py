"""The one model version an offline scorer answers with, loaded as the server loads it: the folder its version policy
and the name select (``Only``: no other model or version is read), the trusted-digests and symlink checks, the
manifest's sha256 list, the warm-up, the model's ``config.yaml`` over the settings (batch budgets, sample counts).

The version is held as the server holds a ready one (``ReadyVersion``): its batch worker is built, for its batch cost
and its forward (``BatchWorker.infer``), but never started; nothing is queued on it."""

from __future__ import annotations

from pathlib import Path

from artifact.contract import is_published
from service.config import Settings
from service.engine import trust
from service.engine.artifact import ArtifactError, load_artifact
from service.engine.batching import BatchWorker
from service.engine.device import Device, resolve_device
from service.engine.model_settings import ModelConfigFile, check_sampling, read_config, serving_settings
from service.engine.repository import ModelVersion, Only, ReadyVersion, VersionState, version_key, without_paths
from service.errors import shown


class ScoringError(Exception):
    """The run cannot score at all (no such version, one that does not load, options it cannot take): one line."""


def device_for(settings: Settings) -> Device:
    """The device the server would run on with these settings (its torch threads set)."""
    return resolve_device(settings.device, settings.bf16, settings.torch_threads, settings.max_batch_samples,
                          settings.max_batch_tokens, settings.shape_buckets, settings.concurrent_forwards)


def version_folder(root: Path, only: Only) -> tuple[Path, ModelConfigFile | None]:
    """The folder of the version to score and the model's config.yaml: the version named, else the highest one its
    version policy serves, as the server's repository chooses it."""
    model_dir = root / only.model
    if not is_published(model_dir):
        raise ScoringError(f"no model {shown(only.model)} in {root}")
    try:
        config = read_config(model_dir, root)
    except ValueError as exc:
        raise ScoringError(f"model {shown(only.model)}: {exc}") from exc
    folders = {d.name: d for d in filter(is_published, sorted(model_dir.iterdir()))}
    policy = config.version_policy if config is not None else None
    chosen = only.narrowed(policy.selects(list(folders), version_key) if policy is not None else set(folders))
    if not chosen:
        wanted = f"version {shown(only.version)}" if only.version is not None else "a version"
        raise ScoringError(f"model {shown(only.model)} has no {wanted} its version policy serves "
                           f"(its versions: {', '.join(sorted(folders, key=version_key)) or 'none'})")
    return folders[chosen.pop()], config


def load_version(root: Path, only: Only, settings: Settings) -> ReadyVersion:
    """The version ``only`` names, loaded and checked; ``ScoringError`` with the reason the server would give."""
    folder, config = version_folder(root, only)
    device = device_for(settings)
    try:
        serving = serving_settings(config, device.shapes, settings.max_batch_delay_ms, settings.max_queue,
                                   settings.request_timeout_s)
        trust.check(root, folder, settings.trusted_digests)  # before torch.jit.load runs anything
        artifact = load_artifact(folder, device)
        check_sampling(serving, artifact.default_samples, artifact.max_samples)
    except (ArtifactError, trust.Untrusted, ValueError) as exc:
        raise ScoringError(f"model {shown(only.model)} version {folder.name} is unavailable: "
                           f"{without_paths(str(exc), root)}") from exc
    worker = BatchWorker(artifact, device, serving.max_batch_samples, serving.max_batch_delay_ms, serving.max_queue,
                         max_batch_tokens=serving.max_batch_tokens)
    ready = ModelVersion(only.model, folder.name, folder, (), VersionState.READY, artifact=artifact, worker=worker,
                         serving=serving).ready()
    assert ready is not None, "a version with its artifact, worker and settings is ready"
    return ready
