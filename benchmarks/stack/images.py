"""The images of the stack, built here with no image registry: a Debian bookworm root file system from
``debootstrap`` imported as the base of everything, local stand-ins for the official PostgreSQL, Prometheus,
Alertmanager and PyTorch images (docker/local/), and the project's serving and training images from
docker/Dockerfile with the local PyTorch image as their ``TORCH_IMAGE``."""

from __future__ import annotations

import contextlib
import functools
import http.server
import re
import shutil
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from benchmarks.server import ROOT
from benchmarks.stack.daemon import Docker, DockerError

LOCAL = ROOT / "docker" / "local"
DEBIAN = "director-local/debian:bookworm"
MIRROR = "http://deb.debian.org/debian"
HOST_TRUST = Path("/etc/ssl/certs/ca-certificates.crt")  # the host's CA bundle (Debian's path)
# docker-compose.yml's image variables and the local image each one names in this run
STAND_INS = {"POSTGRES_IMAGE": "postgres", "PROMETHEUS_IMAGE": "prometheus", "ALERTMANAGER_IMAGE": "alertmanager"}
SERVICE_IMAGE, TRAIN_IMAGE = "director-serving:latest", "director-train:latest"


@dataclass(frozen=True)
class Built:
    tag: str
    seconds: float  # 0 when the image was already in the engine's cache
    bytes: int


def torch_pin() -> str:
    """The torch version pyproject.toml pins (``torch==X``)."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return next(re.fullmatch(r"torch==(\S+)", d).group(1) for d in deps if d.startswith("torch=="))


def _cached(docker: Docker, tag: str) -> bool:
    return docker.run("image", "inspect", tag, check=False).returncode == 0


def debian(docker: Docker, work: Path, rebuild: bool) -> Built:
    """Debian bookworm (minbase, with CA certificates) from the mirror by debootstrap, imported as an image."""
    if not rebuild and _cached(docker, DEBIAN):
        return Built(DEBIAN, 0.0, docker.image_bytes(DEBIAN))
    start = time.monotonic()
    rootfs = work / "rootfs"
    shutil.rmtree(rootfs, ignore_errors=True)
    subprocess.run(["debootstrap", "--variant=minbase", "--include=ca-certificates", "bookworm", str(rootfs), MIRROR],
                   check=True, capture_output=True, text=True, timeout=1800)
    tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
    imported = subprocess.run(["docker", "import", "-", DEBIAN], stdin=tar.stdout, env=docker.env(),
                              capture_output=True, text=True, timeout=600)
    tar.wait()
    if imported.returncode != 0:
        raise DockerError(f"docker import: {imported.stderr[-2000:]}")
    shutil.rmtree(rootfs, ignore_errors=True)
    return Built(DEBIAN, time.monotonic() - start, docker.image_bytes(DEBIAN))


def torch_wheels(work: Path, version: str) -> Path:
    """The wheels of torch ``version`` and its dependencies for this Python (the pip configuration of this machine
    finds most of them on its disk)."""
    folder = work / "wheels"
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--only-binary", ":all:", "-d", str(folder),
                    f"torch=={version}"], check=True, capture_output=True, text=True, timeout=3600)
    return folder


@contextlib.contextmanager
def served(folder: Path) -> Iterator[str]:
    """``folder`` over HTTP on a loopback port for the length of the block (builds run with the host's network)."""
    handler = functools.partial(_QuietHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's signature
        pass


def build(docker: Docker, tag: str, dockerfile: Path, context: Path, args: dict[str, str] | None = None,
          target: str | None = None, rebuild: bool = False) -> Built:
    """``docker build`` with the host's network (the package registries are reachable only from it)."""
    if not rebuild and _cached(docker, tag):
        return Built(tag, 0.0, docker.image_bytes(tag))
    command = ["build", "--network", "host", "-f", str(dockerfile), "-t", tag]
    for key, value in (args or {}).items():
        command += ["--build-arg", f"{key}={value}"]
    if target:
        command += ["--target", target]
    start = time.monotonic()
    docker.run(*command, str(context), timeout=3600)
    return Built(tag, time.monotonic() - start, docker.image_bytes(tag))


def local_images(docker: Docker, work: Path, rebuild: bool) -> dict[str, Built]:
    """Debian, then the stand-ins of the official images, keyed by what they stand in for. Debian and the PyTorch
    image are rebuilt only when missing or with ``rebuild`` (the tag names the torch pin; the wheels' URL changes
    every run, so the classic builder's cache would miss)."""
    built = {"debian": debian(docker, work, rebuild)}
    torch_tag = f"director-local/torch:{torch_pin()}"
    if rebuild or not _cached(docker, torch_tag):
        context = work / "torch-context"
        context.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(HOST_TRUST, context / "ca-certificates.crt")
        with served(torch_wheels(work, torch_pin())) as url:
            built["torch"] = build(docker, torch_tag, LOCAL / "torch.Dockerfile", context,
                                   {"WHEELS_URL": url, "TORCH_VERSION": torch_pin()}, rebuild=True)
    else:
        built["torch"] = Built(torch_tag, 0.0, docker.image_bytes(torch_tag))
    for name in STAND_INS.values():  # always through the layer cache: an edit of docker/local/ takes effect
        built[name] = build(docker, f"director-local/{name}:bookworm", LOCAL / f"{name}.Dockerfile", LOCAL,
                            rebuild=True)
    return built


def project_images(docker: Docker, torch_image: str, rebuild: bool) -> dict[str, Built]:
    """The serving and training images of docker/Dockerfile on the local PyTorch base. Always rebuilt from the
    working tree unless ``rebuild`` is off and they exist; the classic builder's layer cache keeps a rebuild cheap."""
    args = {"TORCH_IMAGE": torch_image}
    dockerfile = ROOT / "docker" / "Dockerfile"
    # the classic builder builds every stage before the target, and `train` comes before `service`: train first,
    # so that each image's time is its own
    train = build(docker, TRAIN_IMAGE, dockerfile, ROOT, args, "train", rebuild)
    return {"service": build(docker, SERVICE_IMAGE, dockerfile, ROOT, args, "service", rebuild), "train": train}
