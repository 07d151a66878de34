"""The stack check's compose project, rendered by the real Compose v2 (``docker compose config`` needs no engine) and
its Prometheus copy checked by the real promtool: what `make compose-test` runs differs from the committed files only
where its docstring says."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import yaml

from benchmarks.server import ROOT
from benchmarks.stack.compose import (
    COMPOSE,
    FILES,
    GATEWAY,
    INTERVAL,
    RULE_WAIT,
    SERVER,
    SUBNET,
    Stack,
    fast_prometheus,
)
from benchmarks.stack.daemon import Docker
from tests.deploy.conftest import PROMETHEUS_DIR, promtool, run_tool


def rendered(stack: Stack, *profiles: str) -> dict:
    args = [arg for profile in profiles for arg in ("--profile", profile)]
    return json.loads(stack.compose(*args, "config", "--format", "json").stdout)


def test_the_check_runs_the_cpu_server_with_monitoring_and_grafana_off(tmp_path: Path) -> None:
    stack = Stack(Docker(tmp_path / "no-engine.sock"), tmp_path / "run", "director-local/torch:2.14.1")
    services = rendered(stack)["services"]  # the run's .env: COMPOSE_PROFILES=cpu
    assert set(services) == {SERVER, "postgres", "prometheus", "alertmanager"}
    assert "deploy" not in services[SERVER]
    assert services["postgres"]["image"] == "director-local/postgres:bookworm"
    assert services[SERVER]["build"]["args"]["TORCH_IMAGE"] == "director-local/torch:2.14.1"
    assert services[SERVER]["environment"]["DIRECTOR_API_KEY"] == stack.api_key
    published = {p["published"] for p in services[SERVER]["ports"]}
    assert published == {str(stack.ports["SERVICE_PORT"]), str(stack.ports["GRPC_PORT"])}
    mounts = {v["target"]: v["source"] for v in services["prometheus"]["volumes"]}
    assert mounts["/etc/prometheus"] == str(stack.folder / "prometheus")
    network = rendered(stack)["networks"]["default"]["ipam"]["config"][0]
    assert network == {"subnet": SUBNET, "gateway": GATEWAY}
    assert (stack.folder / "webhook-url").read_text().startswith(f"http://{GATEWAY}:{stack.webhook_port}/")
    assert len(set(stack.ports.values())) == 5  # distinct: the receiver never takes a published port
    assert "grafana" in rendered(stack, "grafana")["services"]


def test_the_cpu_override_drops_only_the_training_jobs_gpu_reservation(tmp_path: Path) -> None:
    stack = Stack(Docker(tmp_path / "no-engine.sock"), tmp_path / "run", "torch")
    train = rendered(stack, "train")["services"]["train"]
    assert "deploy" not in train
    gpu_host = subprocess.run(  # the same .env, the compose file alone: the GPU host's command
        [str(COMPOSE), "--project-directory", str(ROOT), "--env-file", str(stack.folder / ".env"),
         "-f", str(FILES[0]), "--profile", "train", "config", "--format", "json"],
        env=stack.docker.env(), capture_output=True, text=True, check=True)
    devices = json.loads(gpu_host.stdout)["services"]["train"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["capabilities"] == ["gpu"]
    assert train["command"] == json.loads(gpu_host.stdout)["services"]["train"]["command"]


def test_fast_prometheus_changes_only_the_periods_and_waits(tmp_path: Path) -> None:
    folder = fast_prometheus(tmp_path / "prometheus")
    checked = run_tool([promtool(), "check", "config", str(folder / "prometheus.yml")], cwd=folder)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    config = yaml.safe_load((folder / "prometheus.yml").read_text())
    assert config["global"]["scrape_interval"] == config["global"]["evaluation_interval"] == INTERVAL
    committed = yaml.safe_load((PROMETHEUS_DIR / "rules" / "alerts.yml").read_text())
    fast = yaml.safe_load((folder / "rules" / "alerts.yml").read_text())
    for before, after in zip(committed["groups"][0]["rules"], fast["groups"][0]["rules"], strict=True):
        assert after == {**before, **({"for": RULE_WAIT} if "for" in before else {})}
