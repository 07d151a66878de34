"""Alertmanager (docker/alertmanager/alertmanager.yml): amtool checks the config and routes every alert of the
rule files; compose and Prometheus wire it up; and the real Alertmanager binary (Debian package
``prometheus-alertmanager``, installed by ``make test``) loads the committed config and delivers an alert to the
receiver's webhook, whose URL it reads from the secret file as in the container."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.deploy.conftest import (
    ALERTMANAGER_CONFIG,
    ALERTMANAGER_DIR,
    PROMETHEUS_CONFIG,
    alertmanager,
    amtool,
    compose,
    free_port,
    process_group,
    run_tool,
    wait_http,
)
from tests.deploy.test_prometheus_rules import alert_rules
from tests.waiting import wait_for

RECEIVER = "operators"


def config() -> dict[str, Any]:
    return yaml.safe_load(ALERTMANAGER_CONFIG.read_text())


def secret_target() -> str:
    """Where compose mounts the webhook-URL secret in the Alertmanager container (the default target)."""
    service = compose()["services"]["alertmanager"]
    (name,) = service["secrets"]
    assert name in compose()["secrets"] and "ALERTMANAGER_WEBHOOK_URL_FILE" in compose()["secrets"][name]["file"]
    return f"/run/secrets/{name}"


def test_amtool_check_config() -> None:
    result = run_tool([amtool(), "check-config", str(ALERTMANAGER_CONFIG)])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout and " - 1 receivers" in result.stdout and " - 1 inhibit rules" in result.stdout


def test_amtool_catches_a_broken_config(tmp_path: Path) -> None:
    broken = config()
    broken["route"]["receiver"] = "nobody"  # a route to an undefined receiver
    path = tmp_path / "alertmanager.yml"
    path.write_text(yaml.safe_dump(broken))
    result = run_tool([amtool(), "check-config", str(path)])
    assert result.returncode != 0 and "nobody" in result.stdout + result.stderr


def test_every_alert_routes_to_a_receiver_that_notifies() -> None:
    """Each alert of the rule files, with its own labels, reaches a receiver with an integration (no silent sink);
    critical ones through the critical route, which repeats more often."""
    receivers = {r["name"]: r for r in config()["receivers"]}
    integrations = {name: [key for key in r if key.endswith("_configs") and r[key]] for name, r in receivers.items()}
    for name, rule in alert_rules().items():
        labels = [f"alertname={name}", f"severity={rule['labels']['severity']}", "model=m", "version=1"]
        result = run_tool([amtool(), "config", "routes", "test", f"--config.file={ALERTMANAGER_CONFIG}", *labels])
        assert result.returncode == 0, result.stdout + result.stderr
        receiver = result.stdout.strip()
        assert receiver == RECEIVER and integrations[receiver], (name, receiver)
    routes = config()["route"]["routes"]
    critical = next(r for r in routes if r["matchers"] == ['severity="critical"'])
    assert critical["repeat_interval"] < config()["route"]["repeat_interval"]  # "1h" < "4h"
    assert {rule["labels"]["severity"] for rule in alert_rules().values()} == {"warning", "critical"}


def test_the_webhook_url_is_a_mounted_secret_not_in_the_file() -> None:
    (slack,) = next(r for r in config()["receivers"] if r["name"] == RECEIVER)["slack_configs"]
    assert slack["api_url_file"] == secret_target() and "api_url" not in slack
    assert "http" not in ALERTMANAGER_CONFIG.read_text().split("receivers:")[1]  # no URL anywhere in a receiver
    assert config().get("global", {}).keys() <= {"resolve_timeout"}  # no global webhook or SMTP secrets


def test_compose_and_prometheus_wire_alertmanager_up() -> None:
    service = compose()["services"]["alertmanager"]
    mounts = dict(volume.split(":")[:2] for volume in service["volumes"])
    assert mounts["./docker/alertmanager"] == "/etc/alertmanager"
    assert "--config.file=/etc/alertmanager/alertmanager.yml" in service["command"]
    assert (ALERTMANAGER_DIR / "alertmanager.yml").is_file()
    assert service["ports"][0].endswith(":9093") and service["image"].startswith("${ALERTMANAGER_IMAGE:-")
    # the compose image is the version the tests run (amtool / prometheus-alertmanager from Debian)
    version = run_tool([amtool(), "--version"]).stdout + run_tool([amtool(), "--version"]).stderr
    assert f"version {service['image'].split(':v')[-1].rstrip('}')}" in version, version
    (block,) = yaml.safe_load(PROMETHEUS_CONFIG.read_text())["alerting"]["alertmanagers"]
    assert block["static_configs"] == [{"targets": ["alertmanager:9093"]}]


class _Sink(BaseHTTPRequestHandler):
    received: list[dict[str, Any]] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        _Sink.received.append(json.loads(body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture()
def webhook() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    _Sink.received = []
    server = HTTPServer(("127.0.0.1", 0), _Sink)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hooks/director", _Sink.received
    finally:
        server.shutdown()
        server.server_close()


def test_the_real_alertmanager_delivers_a_critical_alert(tmp_path: Path,
                                                         webhook: tuple[str, list[dict[str, Any]]]) -> None:
    """The committed config, with only the secret's path moved to a temp file (as compose mounts it), in the real
    binary: an alert posted the way Prometheus posts it reaches the webhook as a Slack message after the critical
    route's group_wait, its title and text rendered by the config's templates."""
    url, received = webhook
    secret = tmp_path / "alertmanager-webhook-url"
    secret.write_text(url + "\n")
    (tmp_path / "alertmanager.yml").write_text(ALERTMANAGER_CONFIG.read_text().replace(secret_target(), str(secret)))
    port = free_port()
    command = [alertmanager(), f"--config.file={tmp_path / 'alertmanager.yml'}", f"--storage.path={tmp_path / 'data'}",
               f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address=", "--log.level=warn"]
    with process_group(command, dict(os.environ), tmp_path / "alertmanager.log", cwd=tmp_path) as proc:
        base = f"http://127.0.0.1:{port}"
        wait_http(f"{base}/-/ready", proc, tmp_path / "alertmanager.log", deadline_s=60)
        rule = alert_rules()["DirectorModelNotReady"]
        alert = {"labels": {"alertname": "DirectorModelNotReady", **rule["labels"], "model": "fashion-vit",
                            "version": "2", "state": "unavailable"},
                 "annotations": {"summary": "fashion-vit v2 is unavailable", "description": "see GET /models"}}
        assert httpx.post(f"{base}/api/v2/alerts", json=[alert], timeout=10).status_code == 200
        wait_for(lambda: received, f"the alert's delivery (log: {tmp_path / 'alertmanager.log'})", poll_s=0.05)
    (message,) = received
    attachment = message["attachments"][0]
    assert attachment["title"] == "[FIRING:1] DirectorModelNotReady"
    assert "*critical* fashion-vit v2 is unavailable" in attachment["text"] and "see GET /models" in attachment["text"]
