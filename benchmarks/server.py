"""``python -m service`` as a benchmark subject: its own process group, ready-wait, and a teardown that
leaves nothing running (SIGTERM to the group for a graceful drain, SIGKILL if that does not finish)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _stop(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    with contextlib.suppress(ProcessLookupError):  # anything the server left in its group
        os.killpg(proc.pid, signal.SIGKILL)


@contextlib.contextmanager
def running_server(repository: Path, default_model: str, threads: int, extra: list[str],
                   ready_timeout_s: float = 300.0, root: Path = ROOT) -> Iterator[str]:
    """Serve ``repository`` on a free loopback port with torch pinned to ``threads``; yields the base URL. ``root``:
    the source tree whose ``service`` package serves (another commit's checkout, for an A/B)."""
    with server_process(repository, default_model, threads, extra, ready_timeout_s, root) as (_, url):
        yield url


@contextlib.contextmanager
def server_process(repository: Path, default_model: str, threads: int, extra: list[str],
                   ready_timeout_s: float = 300.0, root: Path = ROOT) -> Iterator[tuple[subprocess.Popen, str]]:
    """As ``running_server``, yielding the process too (its pid, for resident memory)."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="director-bench-") as tmp:
        cmd = [sys.executable, "-m", "service", "--host", "127.0.0.1", "--port", str(port), "--model-repository",
               str(repository), "--default-model", default_model, "--torch-threads", str(threads),
               "--poll-interval-s", "0", "--log-level", "warning", "--feedback-db", str(Path(tmp) / "feedback.db"),
               *extra]
        proc = subprocess.Popen(cmd, cwd=root, env=os.environ.copy(), start_new_session=True)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + ready_timeout_s
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"server exited with {proc.returncode}: {' '.join(cmd)}")
                if time.monotonic() > deadline:
                    raise RuntimeError("server did not become ready")
                try:
                    if httpx.get(f"{url}/health/ready", timeout=2).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.2)
            yield proc, url
        finally:
            _stop(proc)
