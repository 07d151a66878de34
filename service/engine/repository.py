"""The model repository: every ``<model>/<version>/`` folder, its state and its batching worker.

States: ``loading`` -> ``ready`` or ``unavailable`` (with the reason). A broken folder is reported and
never takes the others down. ``scan()`` (run at start and then every ``poll_interval_s``) picks up new,
changed and removed folders without a restart: a changed folder is loaded beside the old one and swapped
in only once warm (when it fails to load, the old one keeps serving and reports the failure as ``reload_error``); a
replaced or removed version's worker finishes its queued requests before stopping. An edit of the trusted digests
file re-checks every version at the next scan."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from artifact.contract import is_published
from service.engine import trust
from service.engine.artifact import Artifact, ArtifactError, load_artifact, read_manifest
from service.engine.batching import BatchWorker
from service.engine.device import Device
from service.engine.heap import collect_retired, freeze_long_lived, thaw
from service.engine.model_settings import (
    CONFIG_FILE,
    ModelConfigFile,
    ServingSettings,
    check_sampling,
    read_config,
)

log = logging.getLogger("service.engine.repository")
RETIRED_COLLECT_DELAY_S = 1.0  # after a retired worker closes, before its version is collected


class VersionState(StrEnum):
    LOADING = "loading"
    READY = "ready"
    UNAVAILABLE = "unavailable"


@dataclass
class ModelVersion:
    name: str
    version: str
    folder: Path
    fingerprint: tuple  # the folder's files (name, size, mtime) and the allowlist's (size, mtime) when loaded
    state: VersionState = VersionState.LOADING
    reason: str | None = None
    artifact: Artifact | None = None
    worker: BatchWorker | None = None
    loaded_at: float | None = None
    manifest: dict = field(default_factory=dict)
    # a changed folder that failed to load while this version kept serving its earlier files: its fingerprint (not
    # retried until the folder or the allowlist changes again) and why it failed
    failed_fingerprint: tuple | None = None
    reload_error: str | None = None
    serving: ServingSettings | None = None  # the model's settings (config.yaml over the server's) it loaded with

    @property
    def method(self) -> str:
        return str(self.manifest.get("method", "unknown"))

    def ready(self) -> ReadyVersion | None:
        """This version as one that can serve, or None while it is loading or unavailable."""
        if self.state is not VersionState.READY or None in (self.artifact, self.worker, self.serving):
            return None
        serving, artifact = self.serving, self.artifact
        return ReadyVersion(self.name, self.version, artifact, self.worker, serving,
                            serving.default_samples or artifact.default_samples,
                            serving.max_samples or artifact.max_samples)


@dataclass(frozen=True)
class ReadyVersion:
    """A version that can serve, as resolution returns it: its artifact and batching worker are always there."""

    name: str
    version: str
    artifact: Artifact
    worker: BatchWorker
    serving: ServingSettings  # what this model is served with (its config.yaml over the server's settings)
    default_samples: int  # the config.yaml's, else the manifest's
    max_samples: int  # the config.yaml's, else the manifest's


def version_key(version: str) -> tuple[int, int, str]:
    """Numeric versions sort numerically and above non-numeric ones."""
    return (1, int(version), "") if version.isdigit() else (0, 0, version)


def fingerprint(folder: Path) -> tuple[tuple[str, int, int], ...]:
    try:
        return tuple(sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in folder.iterdir()
                            if p.is_file()))
    except OSError:
        return ()


def file_print(path: Path | None) -> tuple[int, int] | None:
    """(size, mtime) of one file, so an edit of it is noticed at the next scan; None when there is none."""
    try:
        stat = path.stat() if path is not None else None
    except OSError:
        return (-1, -1)
    return None if stat is None else (stat.st_size, stat.st_mtime_ns)


def without_paths(reason: str, root: Path) -> str:
    """A load error's text with the repository's absolute location cut off (``fashion-vit/3/director.ts``)."""
    for prefix in {str(root.resolve()), str(root.absolute())}:
        reason = reason.replace(prefix + "/", "").replace(prefix, "<repository>")
    return reason


@dataclass(frozen=True)
class Only:
    """The one model version a repository loads, for a process that serves nothing else (the batch scorer: the
    other models' gigabytes are none of its business): the version named, else the model's highest one that its
    version policy selects."""

    model: str
    version: str | None = None

    def narrowed(self, chosen: set[str]) -> set[str]:
        if self.version is not None:
            return chosen & {self.version}
        return {max(chosen, key=version_key)} if chosen else set()


WorkerFactory = Callable[[str, str, Artifact, ServingSettings], BatchWorker]
SettingsFactory = Callable[[ModelConfigFile | None], ServingSettings]


class ModelRepository:
    def __init__(self, root: Path, device: Device, make_worker: WorkerFactory, settings_of: SettingsFactory,
                 drain_timeout_s: float, on_change: Callable[[], None] | None = None,
                 trusted_digests: Path | None = None) -> None:
        self.root = root
        self.trusted_digests = trusted_digests
        self.device = device
        self.make_worker = make_worker
        self.drain_timeout_s = drain_timeout_s
        self.on_change = on_change
        self.models: dict[str, dict[str, ModelVersion]] = {}
        self.scanned_once = False
        self._scan_lock = asyncio.Lock()
        self._retiring: set[asyncio.Task[None]] = set()
        self._defaults: dict[str, str] = {}  # per model: the version serving as its default
        self.unloaded: set[str] = set()  # models taken out by ``unload``: scans skip their folders until ``load``
        self.only: Only | None = None  # set before the first scan: every other folder is left alone
        self._scanner: asyncio.Task[None] | None = None
        self._first_scan = asyncio.Event()  # set once the first scan is over, even one that failed
        self.settings_of = settings_of  # a model's config.yaml (or None) -> its serving settings
        self.configs: dict[str, ModelConfigFile | ValueError | None] = {}  # per model: its file, or why it is bad
        self.config_prints: dict[str, tuple[int, int] | None] = {}  # per model: its config.yaml's (size, mtime) as read
        # per model: the print and what was read at it, so an unchanged file is not parsed again
        self._config_reads: dict[str, tuple[tuple[int, int] | None, ModelConfigFile | ValueError | None]] = {}

    # lookups -------------------------------------------------------------------------------------------

    def versions(self, name: str) -> list[ModelVersion]:
        return sorted(self.models.get(name, {}).values(), key=lambda v: version_key(v.version))

    def default_version(self, name: str) -> ModelVersion | None:
        """The highest ready version. While a higher one is still loading, the version already serving as the default
        keeps serving and no other becomes it: the default never moves backwards through older versions as they
        become ready (requests get 503 with ``Retry-After`` until the newest is ready). A higher version that failed
        to load does not hold it back."""
        versions = self.versions(name)
        ready = [v for v in versions if v.state is VersionState.READY]
        if not ready:
            return None
        newest = version_key(ready[-1].version)
        if any(v.state is VersionState.LOADING and version_key(v.version) > newest for v in versions):
            serving = self._defaults.get(name)
            return next((v for v in ready if v.version == serving), None)
        self._defaults[name] = ready[-1].version
        return ready[-1]

    def get(self, name: str, version: str | None) -> ModelVersion | None:
        """The named version, or the highest ready one; None when there is none."""
        if version is None:
            return self.default_version(name)
        return self.models.get(name, {}).get(version)

    def all_versions(self) -> list[ModelVersion]:
        return [v for name in sorted(self.models) for v in self.versions(name)]

    def is_known(self, name: str, version: str | None = None) -> bool:
        return name in self.models and (version is None or version in self.models[name])

    # scanning ------------------------------------------------------------------------------------------
    async def _folders(self) -> dict[tuple[str, str], Path]:
        """Every version folder to serve: published ones, of models not unloaded, within the model's version policy
        (its config.yaml, read here for the whole scan)."""
        found: dict[tuple[str, str], Path] = {}
        self.configs, self.config_prints = {}, {}
        if not self.root.is_dir():
            return found
        for model_dir in filter(is_published, sorted(self.root.iterdir())):
            if model_dir.name in self.unloaded or (self.only is not None and model_dir.name != self.only.model):
                continue
            config = await self._config(model_dir)
            folders = {d.name: d for d in filter(is_published, sorted(model_dir.iterdir()))}
            policy = config.version_policy if isinstance(config, ModelConfigFile) else None
            chosen = policy.selects(list(folders), version_key) if policy is not None else set(folders)
            if self.only is not None:
                chosen = self.only.narrowed(chosen)
            for name in sorted(chosen):
                found[(model_dir.name, name)] = folders[name]
        return found

    async def _config(self, model_dir: Path) -> ModelConfigFile | ValueError | None:
        """The model's config.yaml, parsed off the event loop and only when its (size, mtime) changed. Its print is
        taken first: a file replaced while it is read leaves a stale print, so the next scan reads it again; a print
        taken later could record the new file against settings read from the old one, and no scan would apply the
        new one. A file that cannot be used is the model's error, never the scan's."""
        name, print_ = model_dir.name, file_print(model_dir / CONFIG_FILE)
        self.config_prints[name] = print_
        cached = self._config_reads.get(name)
        if cached is not None and cached[0] == print_:
            config = cached[1]
        else:
            try:
                config = await asyncio.to_thread(read_config, model_dir, self.root)
            except ValueError as exc:
                config = exc
            except Exception as exc:  # whatever a file does to the parser, the other models keep their scans
                config = ValueError(f"{CONFIG_FILE} cannot be read: {type(exc).__name__}")
            self._config_reads[name] = (print_, config)
        self.configs[name] = config
        return config

    async def scan(self) -> None:
        async with self._scan_lock:
            found = await self._folders()
            loaded = False
            allowlist = file_print(self.trusted_digests)  # an edit of the allowlist re-checks every version
            # newest first: the version a model's default will be is the first of it to become ready
            newest_first = sorted(found.items(), key=lambda item: version_key(item[0][1]), reverse=True)
            for (name, version), folder in sorted(newest_first, key=lambda item: item[0][0]):
                current = self.models.get(name, {}).get(version)
                print_ = (fingerprint(folder), allowlist, self.config_prints.get(name))
                if current is not None and print_ in (current.fingerprint, current.failed_fingerprint):
                    continue
                await self._load(name, version, folder, print_, current)
                loaded = True
            for name in list(self.models):
                for version in list(self.models[name]):
                    if (name, version) not in found:
                        entry = self.models[name].pop(version)
                        log.info("model %s version %s %s", name, version,
                                 "unloaded" if name in self.unloaded else "removed from the repository")
                        self._notify()
                        self._retire(entry)
                if not self.models[name]:
                    del self.models[name]
                    self._defaults.pop(name, None)
            if loaded:  # the new versions live until replaced: keep them out of the collector's full scans
                freeze_long_lived()
            self.scanned_once = True

    async def _load(self, name: str, version: str, folder: Path, print_: tuple, current: ModelVersion | None
                    ) -> None:
        entry = ModelVersion(name, version, folder, print_)
        try:
            entry.manifest = read_manifest(folder)
        except ArtifactError:
            entry.manifest = {}
        if current is None:  # visible as "loading" while it loads; a reload keeps serving the old one
            self.models.setdefault(name, {})[version] = entry
            self._notify()
        started = time.perf_counter()
        try:
            entry.serving = self._serving(name)
            entry.artifact = await asyncio.to_thread(self._load_trusted, folder)
            check_sampling(entry.serving, entry.artifact.default_samples, entry.artifact.max_samples)
        except (ArtifactError, trust.Untrusted, ValueError) as exc:
            entry.state, entry.reason = VersionState.UNAVAILABLE, without_paths(str(exc), self.root)
            log.warning("model %s version %s unavailable: %s", name, version, exc)
        except Exception as exc:  # never let one folder stop the scan
            entry.state = VersionState.UNAVAILABLE
            entry.reason = without_paths(f"{type(exc).__name__}: {exc}", self.root)
            log.exception("model %s version %s failed to load", name, version)
        else:
            entry.worker = self.make_worker(name, version, entry.artifact, entry.serving)
            entry.worker.start()
            entry.state, entry.loaded_at = VersionState.READY, time.time()
            log.info("model %s version %s ready in %.2fs", name, version, time.perf_counter() - started)
        if current is not None and current.ready() is not None and entry.state is VersionState.UNAVAILABLE:
            # a reload that failed: the version keeps serving what it loaded before, and says why it did not change
            current.failed_fingerprint, current.reload_error = print_, entry.reason
            log.warning("model %s version %s keeps serving its earlier files", name, version)
            self._notify()
            return
        self.models.setdefault(name, {})[version] = entry
        if current is not None:
            self._retire(current)
        self._notify()

    def _serving(self, name: str) -> ServingSettings:
        """The model's serving settings; ``ValueError`` (the version's reason) when its config.yaml is invalid."""
        config = self.configs.get(name)
        if isinstance(config, ValueError):
            raise config
        return self.settings_of(config)

    def _load_trusted(self, folder: Path) -> Artifact:
        trust.check(self.root, folder, self.trusted_digests)  # before torch.jit.load runs anything
        return load_artifact(folder, self.device)

    def _notify(self) -> None:
        for name in self.models:  # each model's default as of this change (``default_version`` records it)
            self.default_version(name)
        if self.on_change is not None:
            self.on_change()

    def _retire(self, entry: ModelVersion) -> None:
        if entry.worker is None:
            return
        loop = asyncio.get_running_loop()
        task = loop.create_task(entry.worker.close(self.drain_timeout_s))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)
        # once the scan that retired it has let go of the entry too
        task.add_done_callback(lambda _: loop.call_later(RETIRED_COLLECT_DELAY_S, collect_retired))

    # explicit control (Triton's repository extension), beside polling ------------------------------------
    def published_models(self) -> list[str]:
        """Every model folder of the repository, loaded or not."""
        if not self.root.is_dir():
            return []
        return [d.name for d in filter(is_published, sorted(self.root.iterdir())) if d.is_dir()]

    async def load(self, name: str) -> bool:
        """Serve ``name`` again if it was unloaded, and scan now: a changed or new version is checked and swapped
        in as a poll would do it. False when the repository has no such model folder."""
        if name not in self.published_models():
            return False
        self.unloaded.discard(name)
        await self.scan()
        return True

    async def unload(self, name: str) -> bool:
        """Stop serving every version of ``name`` (queued requests finish first) until ``load``; later scans leave
        its folder alone. False when no such model is known."""
        if name not in self.models and name not in self.published_models():
            return False
        self.unloaded.add(name)
        await self.scan()
        return True

    def start(self, poll_interval_s: float, after_first_scan: Callable[[], Awaitable[None]] | None = None) -> None:
        """Scan in the background, run ``after_first_scan``, then scan again every ``poll_interval_s`` (0: never)."""
        self._scanner = asyncio.get_running_loop().create_task(self._scan_then_poll(poll_interval_s, after_first_scan),
                                                               name="repository")

    async def first_scan(self) -> None:
        """Return once the first scan is over: every version found then is ready or unavailable."""
        await self._first_scan.wait()

    async def _scan_then_poll(self, interval_s: float, after_first_scan: Callable[[], Awaitable[None]] | None
                              ) -> None:
        try:
            await self.scan()
        except Exception:  # the first scan failing must not end the polling that could recover
            log.exception("repository scan failed")
        finally:
            self._first_scan.set()
        if after_first_scan is not None:
            await after_first_scan()
        while interval_s > 0:
            await asyncio.sleep(interval_s)
            try:
                await self.scan()
            except Exception:
                log.exception("repository scan failed")

    async def close(self) -> None:
        """Stop scanning, finish every queued request, then stop all workers."""
        if self._scanner is not None:
            self._scanner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._scanner
        workers = [v.worker for v in self.all_versions() if v.worker is not None]
        await asyncio.gather(*(w.close(self.drain_timeout_s) for w in workers), *self._retiring)
        thaw()
