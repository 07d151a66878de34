"""A private Docker engine for one run: its own data root, exec root and socket, started as root with no iptables rules
and no default bridge (the networks compose creates still work, with their DNS), stopped at the end."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


class DockerError(RuntimeError):
    """A docker or compose command failed; the message carries its output's tail."""


@dataclass(frozen=True)
class Docker:
    """The client bound to one engine (``DOCKER_HOST``). Builds use the classic builder: the engine here has no
    buildx, and the classic builder needs none."""

    socket: Path

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        return {**os.environ, "DOCKER_HOST": f"unix://{self.socket}", "DOCKER_BUILDKIT": "0", **(extra or {})}

    def run(self, *args: str, env: dict[str, str] | None = None, timeout: float = 3600, check: bool = True,
            cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(["docker", *args], env=self.env(env), cwd=cwd, capture_output=True, text=True,
                              timeout=timeout)
        if check and done.returncode != 0:
            raise DockerError(f"docker {' '.join(args[:3])} ... exited {done.returncode}: "
                              f"{(done.stdout + done.stderr)[-3000:]}")
        return done

    def image_bytes(self, tag: str) -> int:
        return int(self.run("image", "inspect", "--format", "{{.Size}}", tag).stdout.strip())


def folder_bytes(path: Path) -> int:
    """Disk usage of a folder as ``du`` counts it (hard links once, sparse files by their blocks)."""
    done = subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True, check=False)
    return int(done.stdout.split()[0]) if done.returncode == 0 and done.stdout else 0


def _ready(docker: Docker, proc: subprocess.Popen, log: Path, deadline_s: float) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise DockerError(f"dockerd exited {proc.returncode}: {log.read_text()[-3000:]}")
        if docker.run("info", "--format", "{{.ServerVersion}}", check=False, timeout=10).returncode == 0:
            return
        time.sleep(0.5)
    raise DockerError(f"dockerd not answering after {deadline_s:.0f} s: {log.read_text()[-3000:]}")


@contextlib.contextmanager
def private_engine(data_root: Path, log: Path) -> Iterator[Docker]:
    """Start ``dockerd`` on ``data_root`` (kept: it caches the images between runs) with a short-lived exec root and
    socket, yield its client, and stop it (SIGTERM, then SIGKILL after 60 s) however the block ends."""
    if shutil.which("dockerd") is None:
        raise DockerError("dockerd not found: install Debian's docker.io (make compose-test does)")
    data_root.mkdir(parents=True, exist_ok=True)
    runtime = Path(tempfile.mkdtemp(prefix="dk-", dir="/tmp"))  # a socket path must stay under 108 bytes
    docker = Docker(runtime / "docker.sock")
    with log.open("ab") as out:
        proc = subprocess.Popen(
            ["dockerd", "--data-root", str(data_root), "--exec-root", str(runtime / "exec"),
             "--pidfile", str(runtime / "dockerd.pid"), "-H", f"unix://{docker.socket}",
             "--iptables=false", "--bridge=none"],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _ready(docker, proc, log, deadline_s=60)
        yield docker
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        shutil.rmtree(runtime, ignore_errors=True)
