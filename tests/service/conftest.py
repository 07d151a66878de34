"""Service test fixtures: real tiny artifacts (image and text) from the real pipeline, and real uvicorn servers on
loopback.

The tiny models are inaccurate on purpose (they train in seconds); accuracy and OOD-rate tests use the
committed default model (``tests/repository_facts.py``: ``default_version_dir()``), and tests that need a small
committed whole-stack DIRECTOR artifact use ``WHOLE_STACK_DIRECTOR_DIR`` (fashion-vit/1)."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import math
import shutil
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import numpy as np
import pytest
import torch
from PIL import Image

from artifact.contract import ARTIFACT, MANIFEST, TOKENIZER, sha256_file
from service.app import create_app
from service.config import Settings
from service.server import DirectorServer, uvicorn_config
from service.state import AppState, Lifecycle
from tests.service.pg_cluster import PostgresCluster
from tests.waiting import until as until  # the suite's waits: the service tests import them from here
from tests.waiting import wait_for as wait_for

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = REPO_ROOT / "examples"


@pytest.fixture(scope="session")
def tiny_artifact(tiny_export: tuple[Path, Path]) -> Path:
    """``<tmp>/repo/tiny/1``: fit-backbone, distil and export on the tiny config (the session's ``tiny_export``)."""
    return tiny_export[1]


@pytest.fixture(scope="session")
def tiny_text_artifact(tiny_text_export: tuple[Path, Path]) -> Path:
    """``<tmp>/repo/tiny-text/1``: the text pipeline on the tiny text config (tiny BERT, WordPiece vocabulary of 400,
    max_length 32 tokens, max_characters 200; the session's ``tiny_text_export``)."""
    folder = tiny_text_export[1]
    assert (folder / TOKENIZER).is_file()
    return folder


def rehash(folder: Path, manifest: dict[str, Any]) -> None:
    """Write ``manifest`` with the sha256 and size of every file it lists as they are now."""
    for name in manifest["files"]:
        manifest["files"][name] = {"sha256": sha256_file(folder / name), "bytes": (folder / name).stat().st_size}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")


def with_noise_scale(source: Path, target: Path, scale: float) -> Path:
    """A copy of an artifact whose sampling noise is multiplied by ``scale`` (0: noise off): the TorchScript module's
    ``rollout.noise_scale`` buffer is set with torch.jit, the module re-saved and the manifest re-hashed. (The exporter
    cannot write this: with a one-point ``export.noise_scale_grid`` it records the value in the manifest but leaves
    the module's buffer as trained.)"""
    shutil.copytree(source, target)
    module = torch.jit.load(str(target / ARTIFACT))
    module.rollout.noise_scale.fill_(scale)
    torch.jit.save(module, str(target / ARTIFACT))
    manifest = json.loads((target / MANIFEST).read_text())
    manifest["sampling"]["noise_scale"] = scale
    rehash(target, manifest)
    return target


def copy_version(source: Path, repository: Path, name: str, version: str) -> Path:
    """Copy an artifact the way the exporter publishes one: into a hidden folder, then rename."""
    target = repository / name / version
    hidden = target.with_name(f".{version}.tmp")
    shutil.copytree(source, hidden)
    hidden.rename(target)
    return target


@dataclass
class Running:
    url: str
    app_state: AppState
    lifecycle: Lifecycle
    server: DirectorServer


@contextmanager
def serve(settings: Settings, wait_ready: bool = True) -> Iterator[Running]:
    """A real uvicorn server for ``settings`` on 127.0.0.1 (a free port) in a background thread."""
    lifecycle = Lifecycle()
    app = create_app(settings, lifecycle)
    server = DirectorServer(uvicorn_config(app, settings.model_copy(update={"port": 0})), lifecycle,
                            settings.shutdown_grace_s)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    # generous: a loaded CI machine may take long to warm a model up
    wait_for(lambda: server.started or not thread.is_alive(), "the server to start", timeout_s=180)
    assert server.started, "server did not start"
    port = server.servers[0].sockets[0].getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    state: AppState = app.state.director
    wait_for(lambda: state.repository.scanned_once, "the repository scan", timeout_s=180)
    if wait_ready:
        assert httpx.get(f"{url}/health/ready", timeout=30).status_code == 200
    try:
        yield Running(url, state, lifecycle, server)
    finally:
        server.should_exit = True
        thread.join(timeout=60)
        assert not thread.is_alive(), "server did not shut down"


def settings_for(repository: Path, tmp: Path, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "host": "127.0.0.1", "port": 0, "model_repository": repository, "default_model": "tiny",
        "torch_threads": 1, "poll_interval_s": 0, "feedback_db": tmp / "feedback.sqlite3", "log_level": "warning",
        "max_batch_delay_ms": 5.0, "metrics_max_age_s": 0.0,  # a scrape sees what the request before it did
    }
    values.update(overrides)
    return Settings(**values)


@pytest.fixture(scope="session")
def tiny_repository(tiny_artifact: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    repository = tmp_path_factory.mktemp("repository")
    copy_version(tiny_artifact, repository, "tiny", "1")
    return repository


@pytest.fixture(scope="session")
def tiny_server(tiny_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    """One shared server on the tiny model for tests that do not change settings."""
    tmp = tmp_path_factory.mktemp("tiny-server")
    settings = settings_for(tiny_repository, tmp, max_body_bytes=2 * 1024 * 1024, max_image_pixels=1_000_000,
                            max_inputs_per_request=32, max_text_chars=100, max_batch_delay_ms=30.0,
                            drift_min_window=20)
    with serve(settings) as running:
        yield running


TEXT_MODEL, QUIET_MODEL = "tiny-text", "tiny-text-quiet"


@pytest.fixture(scope="session")
def text_repository(tiny_text_artifact: Path, tiny_artifact: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``tiny-text`` (as exported), ``tiny-text-quiet`` (the same with its sampling noise off), the tiny image model
    ``tiny``, ``broken-text`` (a tokenizer.json that no longer matches its sha256) and ``overlong-text`` (a manifest
    max_length beyond the artifact's position table, caught by the warm-up)."""
    repository = tmp_path_factory.mktemp("text-repository")
    work = tmp_path_factory.mktemp("text-variants")
    copy_version(tiny_text_artifact, repository, TEXT_MODEL, "1")
    copy_version(with_noise_scale(tiny_text_artifact, work / "quiet", 0.0), repository, QUIET_MODEL, "1")
    copy_version(tiny_artifact, repository, "tiny", "1")
    broken = work / "broken"
    shutil.copytree(tiny_text_artifact, broken)
    with (broken / TOKENIZER).open("a") as handle:
        handle.write(" ")
    copy_version(broken, repository, "broken-text", "1")
    overlong = work / "overlong"  # a manifest promising more tokens than the artifact has positions for
    shutil.copytree(tiny_text_artifact, overlong)
    manifest = json.loads((overlong / MANIFEST).read_text())
    manifest["input"]["max_length"] += 8
    rehash(overlong, manifest)
    copy_version(overlong, repository, "overlong-text", "1")
    return repository


@pytest.fixture(scope="session")
def text_server(text_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    """One shared server on the text models (default ``tiny-text``) and the tiny image model, a batch token budget
    of 4096 (the tests' arithmetic uses it, whatever the default), the manifest's character limit (200) below the
    server's."""
    tmp = tmp_path_factory.mktemp("text-server")
    settings = settings_for(text_repository, tmp, default_model=TEXT_MODEL, max_inputs_per_request=32,
                            drift_min_window=20, max_batch_tokens=4096)
    with serve(settings) as running:
        yield running


@pytest.fixture(scope="session")
def postgres_cluster() -> Iterator[PostgresCluster]:
    """A real PostgreSQL server for the session (a test that stops it starts it again); one database per test."""
    cluster = PostgresCluster()
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()
        cluster.remove()


def one_batch(server: Running, model: str, bodies: list[dict[str, Any]]) -> list[httpx.Response]:
    """POST ``bodies`` to /predict for ``model`` so that the worker packs them into batches by its budget alone, not
    by arrival times: a seeded request (which runs alone) is held inside its forward by taking the device lock,
    ``bodies`` are sent concurrently, and the lock is released only once all of them are queued."""
    entry = server.app_state.repository.get(model, None)
    assert entry is not None and entry.worker is not None
    worker = entry.worker
    lock = server.app_state.device.lock
    held = [False]  # whether this test still holds the device lock
    wait_for(lambda: worker.idle, "the worker to be idle")

    def release() -> None:
        if held[0]:
            held[0] = False
            lock.release()

    async def fire() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
            blocker = asyncio.ensure_future(client.post("/predict", json={
                "model": model, "inputs": bodies[0]["inputs"][:1], "n_samples": 1, "seed": 0}))
            await until(lambda: (worker.depth == 0 and not worker.idle) or blocker.done(),
                        "the seeded request in its forward")
            assert not blocker.done(), blocker.result().text
            tasks = [asyncio.ensure_future(client.post("/predict", json={**body, "model": model})) for body in bodies]
            await until(lambda: worker.depth >= len(bodies) or any(t.done() for t in tasks), "every body queued")
            assert not any(t.done() for t in tasks), [t.result().text for t in tasks if t.done()]
            release()
            responses = await asyncio.gather(*tasks)
            assert (await blocker).status_code == 200
            return list(responses)

    lock.acquire()
    held[0] = True
    try:
        return asyncio.run(fire())
    finally:
        release()


def raw_request(url: str, path: str, content_length: int, sent: bytes, headers: dict[str, str]
                ) -> tuple[int, dict[str, str], dict]:
    """Headers announcing ``content_length`` body bytes, only ``sent`` of them sent, then read the response: an
    answer that arrives while the body has not even been sent proves it came before the body was read."""
    parts = urlsplit(url)
    extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    head = (f"POST {path} HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {content_length}\r\n{extra}\r\n").encode()
    with socket.create_connection((parts.hostname, parts.port), timeout=60) as sock:
        sock.sendall(head + sent)
        return read_response(sock)


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], dict]:
    """One HTTP/1.1 response with a Content-Length and a JSON body: status, lower-cased header fields, body."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, "connection closed before a response"
        data += chunk
    header_blob, _, rest = data.partition(b"\r\n\r\n")
    lines = header_blob.decode().split("\r\n")
    status = int(lines[0].split()[1])
    fields = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    length = int(fields["content-length"])
    while len(rest) < length:
        chunk = sock.recv(65536)
        assert chunk, "connection closed mid-response"
        rest += chunk
    return status, fields, json.loads(rest[:length])


def png_base64(array: np.ndarray) -> str:
    """``array`` uint8 [H, W] or [H, W, C] as a base64 PNG."""
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def random_pixels(rng: np.random.Generator, n: int = 1) -> list[list[list[list[float]]]]:
    return rng.random((n, 1, 28, 28)).round(4).tolist()


def flagged_share(manifest: dict[str, Any], responses: list[dict[str, Any]]) -> float:
    """The share of predictions flagged OOD, after checking that the responses ran at the manifest's default S and
    that every flag is the score against the manifest's threshold for that S."""
    s = responses[0]["n_samples"]
    assert s == manifest["sampling"]["default_samples"]
    threshold = manifest["ood"]["thresholds"][str(s)]["threshold"]
    predictions = [p for r in responses for p in r["predictions"]]
    assert all(p["is_ood"] == (p["ood_score"] > threshold) for p in predictions)
    return sum(p["is_ood"] for p in predictions) / len(predictions)


def metric_value(text: str, name: str, **labels: str) -> float | None:
    """The value of one sample in Prometheus text output (None when absent)."""
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        series, _, label_text = head.partition("{")
        if series != name:
            continue
        found = dict(part.split("=", 1) for part in label_text.rstrip("}").split(",") if part)
        if all(found.get(k) == f'"{v}"' for k, v in labels.items()):
            return float(value)
    return None


def relative_ood_counts(url: str, model: str, version: str) -> dict[float, float]:
    """The cumulative counts of ``director_ood_score_relative`` for one version, by upper bound (+Inf included)."""
    from service.observability.metrics import RELATIVE_OOD_BUCKETS

    text = httpx.get(f"{url}/metrics", timeout=30).text
    counts = {}
    for bound in (*RELATIVE_OOD_BUCKETS, math.inf):
        le = "+Inf" if math.isinf(bound) else repr(float(bound))
        counts[bound] = metric_value(text, "director_ood_score_relative_bucket", model=model, version=version,
                                     le=le) or 0.0
    return counts


def separates_by_relative_score(before: dict[float, float], between: dict[float, float],
                                after: dict[float, float]) -> tuple[float, float, float, float]:
    """From three snapshots of ``relative_ood_counts`` around an in-distribution phase and an OOD phase: each phase's
    share beyond the last finite bucket, and the upper bound of the bucket holding each phase's median."""
    def phase(start: dict[float, float], end: dict[float, float]) -> tuple[float, float]:
        cumulative = {bound: end[bound] - start[bound] for bound in end}
        total = cumulative[math.inf]
        assert total > 0, "no observations in this phase"
        finite = max(bound for bound in cumulative if not math.isinf(bound))
        median = next(bound for bound in sorted(cumulative) if cumulative[bound] >= total / 2)
        return (total - cumulative[finite]) / total, median

    id_inf, id_median = phase(before, between)
    ood_inf, ood_median = phase(between, after)
    return id_inf, ood_inf, id_median, ood_median
