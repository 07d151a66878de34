"""Deployment tests: the Dockerfile, compose file, Prometheus rules and Grafana dashboard of ``docker/``.

No Docker engine runs here, so the images are checked statically (hadolint, the Compose JSON schema) and
their commands are run natively: the server is started with the Dockerfile's own ENTRYPOINT, scraped by a
real Prometheus (Debian package ``prometheus``, installed by ``make test``). Tools are never skipped when
missing: a missing tool fails with the command that installs it."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.waiting import wait_for

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCKER = REPO_ROOT / "docker"
DOCKERFILE = DOCKER / "Dockerfile"
COMPOSE_FILE = REPO_ROOT / "docker-compose.yml"
ENV_EXAMPLE = REPO_ROOT / ".env.example"
PROMETHEUS_DIR = DOCKER / "prometheus"
PROMETHEUS_CONFIG = PROMETHEUS_DIR / "prometheus.yml"
RULES_DIR = PROMETHEUS_DIR / "rules"
RULE_TESTS = PROMETHEUS_DIR / "tests" / "alerts.test.yml"
ALERTMANAGER_DIR = DOCKER / "alertmanager"
ALERTMANAGER_CONFIG = ALERTMANAGER_DIR / "alertmanager.yml"
DASHBOARD = DOCKER / "grafana" / "dashboards" / "director.json"
GRAFANA_PROVISIONING = DOCKER / "grafana" / "provisioning"
K8S_DIR = DOCKER / "k8s"


def tool(name: str, install: str) -> str:
    """The path of a command-line tool, found on PATH or beside this interpreter (the venv's bin/)."""
    found = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    assert found, f"{name} is not installed: {install} (make test does it)"
    return found


def promtool() -> str:
    return tool("promtool", "apt-get install prometheus")


def amtool() -> str:
    return tool("amtool", "apt-get install prometheus-alertmanager")


def alertmanager() -> str:
    return tool("prometheus-alertmanager", "apt-get install prometheus-alertmanager")


def run_tool(args: list[str], timeout: float = 60, cwd: Path = REPO_ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=cwd)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# ---------------------------------------------------------------------------------------------- Dockerfile
@dataclass
class Stage:
    name: str
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)  # (INSTRUCTION, arguments)

    def last(self, instruction: str) -> str | None:
        found = [args for name, args in self.instructions if name == instruction]
        return found[-1] if found else None

    def all(self, instruction: str) -> list[str]:
        return [args for name, args in self.instructions if name == instruction]


def dockerfile_lines(path: Path = DOCKERFILE) -> list[tuple[str, str]]:
    """Instructions with continuation lines joined and comments dropped: (INSTRUCTION, arguments)."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        keyword, _, rest = line.partition(" ")
        out.append((keyword.upper(), rest.strip()))
    return out


def dockerfile_stages(path: Path = DOCKERFILE) -> dict[str, Stage]:
    stages: dict[str, Stage] = {}
    current: Stage | None = None
    for keyword, args in dockerfile_lines(path):
        if keyword == "FROM":
            parts = args.split()
            name = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else str(len(stages))
            current = Stage(name, parts[0])
            stages[name] = current
        elif current is not None:
            current.instructions.append((keyword, args))
    return stages


def exec_form(args: str) -> list[str]:
    """A JSON exec-form argument list (ENTRYPOINT/CMD/HEALTHCHECK CMD); shell form is refused."""
    import json

    assert args.startswith("["), f"not exec form (a shell would wrap it): {args}"
    value = json.loads(args)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value)
    return value


def image_command(stage: str) -> list[str]:
    """The command a container of ``stage`` runs: ENTRYPOINT + CMD (inherited from parent stages)."""
    stages = dockerfile_stages()
    chain = []
    name: str | None = stage
    while name in stages:
        chain.append(stages[name])
        name = stages[name].base
    entrypoint: list[str] = []
    cmd: list[str] = []
    for s in reversed(chain):
        if s.last("ENTRYPOINT") is not None:
            entrypoint = exec_form(s.last("ENTRYPOINT") or "")
            cmd = []  # a new ENTRYPOINT resets the inherited CMD
        if s.last("CMD") is not None:
            cmd = exec_form(s.last("CMD") or "")
    return entrypoint + cmd


def native(command: list[str]) -> list[str]:
    """An image command run here: the image's ``python`` is this interpreter."""
    assert command and command[0] == "python", command
    return [sys.executable, *command[1:]]


def healthcheck_command(stage: str = "service") -> list[str]:
    args = dockerfile_stages()[stage].last("HEALTHCHECK")
    assert args is not None
    _, _, command = args.partition("CMD ")
    return exec_form(command.strip())


def image_env(stage: str = "service") -> dict[str, str]:
    """ENV of a stage (``ENV A=1 B=2`` form)."""
    env: dict[str, str] = {}
    for args in dockerfile_stages()[stage].all("ENV"):
        for item in shlex.split(args):
            key, _, value = item.partition("=")
            env[key] = value
    return env


# ---------------------------------------------------------------------------------------------- compose
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE_FILE.read_text())


def interpolate_defaults(value: str) -> str:
    """Compose interpolation with every variable unset: ``${VAR:-default}`` -> default."""
    import re

    return re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}", lambda m: m.group(2) or "", value)


class InterpolationError(ValueError):
    """What ``docker compose config`` reports for a required variable (``${VAR:?message}``) left unset."""


_INTERPOLATION = re.compile(r"\$(?:(\$)|\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?+])([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")


def interpolate(value: str, env: dict[str, str]) -> str:
    """The Compose specification's interpolation of one string: ``$$``, ``$VAR``, ``${VAR}``, ``${VAR:-default}``
    / ``${VAR-default}``, ``${VAR:?error}`` / ``${VAR?error}`` and ``${VAR:+replacement}`` / ``${VAR+replacement}``
    (with the colon, an empty value counts as unset). No Docker engine or Compose v2 CLI runs here (Debian
    bookworm ships only docker-compose 1.29, which predates the specification), so ``docker compose config`` is
    reproduced for what this repository's compose file uses."""

    def substitute(match: re.Match[str]) -> str:
        if match.group(1):
            return "$"
        name = match.group(2) or match.group(5)
        operator, argument = match.group(3) or "", match.group(4) or ""
        present = name in env and (env[name] != "" or not operator.startswith(":"))
        if operator.endswith("-"):
            return env[name] if present else argument
        if operator.endswith("?"):
            if not present:
                raise InterpolationError(f"required variable {name} is missing a value: {argument}")
            return env[name]
        if operator.endswith("+"):
            return argument if present else ""
        return env.get(name, "")

    return _INTERPOLATION.sub(substitute, value)


def interpolate_tree(node: Any, env: dict[str, str]) -> Any:
    if isinstance(node, str):
        return interpolate(node, env)
    if isinstance(node, list):
        return [interpolate_tree(item, env) for item in node]
    if isinstance(node, dict):
        return {key: interpolate_tree(item, env) for key, item in node.items()}
    return node


def compose_config(env: dict[str, str], profiles: list[str] | None = None) -> dict[str, Any]:
    """``docker compose config`` as far as it matters here: the file (YAML anchors and merge keys resolved)
    interpolated from ``env`` (every string, inactive services included, as Compose does), then only the services
    without a profile or with one of ``profiles`` (from ``COMPOSE_PROFILES`` when not given)."""
    doc = interpolate_tree(compose(), env)
    if profiles is None:
        profiles = [p for p in env.get("COMPOSE_PROFILES", "").split(",") if p]
    doc["services"] = {name: service for name, service in doc["services"].items()
                       if not service.get("profiles") or set(service["profiles"]) & set(profiles)}
    return doc


def env_file(path: Path) -> dict[str, str]:
    """The variables an env file sets (comments and blank lines ignored)."""
    values: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    return values


# ---------------------------------------------------------------------------------------------- processes
@contextmanager
def process_group(cmd: list[str], env: dict[str, str], log: Path, cwd: Path = REPO_ROOT) -> Iterator[subprocess.Popen]:
    """Start ``cmd`` in its own session; on exit kill the whole group (uvicorn workers included) and reap it."""
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            yield proc
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def wait_http(url: str, proc: subprocess.Popen, log: Path, deadline_s: float = 180.0) -> None:
    """Poll ``url`` until 200 (generous deadline: CI machines are loaded); fail early if ``proc`` died."""
    def ready() -> bool:
        assert proc.poll() is None, f"{proc.args} exited {proc.returncode}:\n{log.read_text()[-4000:]}"
        with contextlib.suppress(httpx.TransportError):
            return httpx.get(url, timeout=2).status_code == 200
        return False

    try:
        wait_for(ready, f"{url} to answer 200", timeout_s=deadline_s, poll_s=0.1)
    except AssertionError as error:
        if "timed out" in str(error):
            raise AssertionError(f"{url} not ready in {deadline_s}s:\n{log.read_text()[-4000:]}") from error
        raise
