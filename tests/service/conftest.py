"""Service test fixtures: a real tiny artifact from the real pipeline, and real uvicorn servers on loopback.

The tiny model is inaccurate on purpose (it trains in seconds); accuracy and OOD-rate tests use the
committed default model in ``model_repository/fashion-vit/1/``."""

from __future__ import annotations

import base64
import io
import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import yaml
from PIL import Image

from service.app import create_app
from service.config import Settings
from service.server import DirectorServer, uvicorn_config
from service.state import AppState, Lifecycle

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MODEL_DIR = REPO_ROOT / "model_repository" / "fashion-vit" / "1"
EXAMPLES = REPO_ROOT / "examples"


@pytest.fixture(scope="session")
def tiny_artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``<tmp>/repo/tiny/1``: fit-backbone, distil and export on the tiny config (about 15 s)."""
    from tests.conftest import tiny_config_dict
    from training.cli import main

    tmp = tmp_path_factory.mktemp("tiny-pipeline")
    config = tmp / "tiny.yaml"
    config.write_text(yaml.safe_dump(tiny_config_dict(tmp)))
    for stage in ("fit-backbone", "distil", "export"):
        assert main([stage, "--config", str(config)]) == 0
    folder = tmp / "repo" / "tiny" / "1"
    assert (folder / "manifest.json").is_file()
    return folder


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
    deadline = time.monotonic() + 180  # generous: a loaded CI machine may take long to warm a model up
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "server did not start"
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    state: AppState = app.state.director
    while not state.repository.scanned_once:
        assert time.monotonic() < deadline, "repository scan did not finish"
        time.sleep(0.02)
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
        "max_batch_delay_ms": 5.0,
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


def png_base64(array: np.ndarray) -> str:
    """``array`` uint8 [H, W] or [H, W, C] as a base64 PNG."""
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def random_pixels(rng: np.random.Generator, n: int = 1) -> list[list[list[list[float]]]]:
    return rng.random((n, 1, 28, 28)).round(4).tolist()


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
