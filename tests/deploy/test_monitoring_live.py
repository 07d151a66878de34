"""A real Prometheus (Debian package) scraping the real server, started with the Dockerfile's own ENTRYPOINT
on loopback, serving a committed model as its default (WHOLE_STACK_DIRECTOR_DIR, fashion-vit/1: a small whole-stack
DIRECTOR version, quick on a CPU) while the test sends in-distribution traffic (Fashion-MNIST
test images, asking for prediction sets and abstentions), then OOD traffic (uniform noise), feedback and one
overload burst. Every PromQL expression of the
Grafana dashboard and of the alert rules, read from the committed files, must then return data through the
Prometheus HTTP API, and the dashboard's OOD-rate query must rise with the OOD traffic.

Settings that make every metric appear within seconds come through DIRECTOR_* variables, as in a container:
a drift window that reports after 10 confidences, a queue of 2 (the burst is partly refused with 503, which the
5xx, queue and refusal expressions need), and a broken version 2 beside the default model (model-not-ready). The
default model's copy gets a conformal part (tests/deploy/conformal.py), so live coverage and selective risk exist."""

from __future__ import annotations

import asyncio
import json
import math
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import yaml

from tests.deploy.conformal import with_conformal
from tests.deploy.conftest import (
    ALERTMANAGER_CONFIG,
    PROMETHEUS_CONFIG,
    RULES_DIR,
    free_port,
    healthcheck_command,
    image_command,
    native,
    process_group,
    tool,
    wait_http,
)
from tests.deploy.promql import (
    Expression,
    alert_expressions,
    dashboard_expressions,
    is_number,
    label_values_query,
    operands,
    panels,
    recorded_series,
    rule_groups,
    substitute,
    variables,
)
from tests.repository_facts import WHOLE_STACK_DIRECTOR_DIR
from tests.service.conftest import separates_by_relative_score
from tests.waiting import wait_for as wait_on
from training.data.images import load_fashion_mnist_split

FASHION_ROOT = Path("/usr/share/datasets/fashion-mnist")
PHASE_IMAGES = 64  # per phase; 8 per request at the default 16 samples
PER_REQUEST = 8
DECISIONS = {"coverage": 0.9, "max_risk": 0.2, "abstain_if_ood": False}  # asked with the in-distribution phase
FEEDBACK = 32
GPU_METRIC = "director_gpu_memory_allocated_bytes"
GPU_DEVICE_METRIC = "director_gpu_memory_used_bytes"
GPU_TOTAL_METRIC = "director_gpu_memory_total_bytes"


@dataclass
class Stack:
    service_url: str
    service_port: int
    prometheus_url: str
    alertmanager_url: str
    model: str
    t_in_distribution: float  # after the in-distribution phase was scraped
    t_ood: float  # after the OOD phase was scraped
    refused: int  # 503s of the overload burst
    variable_values: dict[str, str]


def prometheus_config(service_port: int, prometheus_port: int, alertmanager_port: int) -> dict[str, Any]:
    """The committed config, pointed at loopback: 1 s scrapes and rule evaluations, the director job's
    service discovery replaced by the test server's address, the committed rule files by absolute path, and
    the test's Alertmanager in place of the compose service."""
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    (alertmanagers,) = config["alerting"]["alertmanagers"]
    alertmanagers["static_configs"] = [{"targets": [f"127.0.0.1:{alertmanager_port}"]}]
    config["global"].update(scrape_interval="1s", evaluation_interval="1s")
    config["rule_files"] = [str(RULES_DIR / Path(pattern).name) for pattern in config["rule_files"]]
    targets = {"director": f"127.0.0.1:{service_port}", "prometheus": f"127.0.0.1:{prometheus_port}"}
    for job in config["scrape_configs"]:
        job.pop("dns_sd_configs", None)
        job["static_configs"] = [{"targets": [targets[job["job_name"]]]}]
    return config


def query(prometheus_url: str, expr: str, at: float | None = None) -> dict[str, Any]:
    params: dict[str, Any] = {"query": expr}
    if at is not None:
        params["time"] = at
    response = httpx.get(f"{prometheus_url}/api/v1/query", params=params, timeout=30)
    body = response.json()
    assert response.status_code == 200 and body["status"] == "success", f"{expr}: {body}"
    return body["data"]


def values(data: dict[str, Any]) -> list[float]:
    """The sample values of an instant query (vector or scalar)."""
    if data["resultType"] == "scalar":
        return [float(data["result"][1])]
    return [float(item["value"][1]) for item in data["result"]]


def wait_for(prometheus_url: str, expr: str, predicate: Any, timeout_s: float = 60.0) -> list[float]:
    found: list[list[float]] = []

    def holds() -> bool:
        found.append(values(query(prometheus_url, expr)))
        return bool(found[-1]) and predicate(found[-1])

    wait_on(holds, f"{expr} to satisfy the condition", timeout_s=timeout_s, poll_s=0.1)
    return found[-1]


def wait_equal(prometheus_url: str, expr: str, expected: float) -> None:
    """Wait until Prometheus has scraped (and its rules seen) a counter total the test knows."""
    wait_for(prometheus_url, expr, lambda found: found == [float(expected)])


def pixels_body(images: np.ndarray, ask: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"inputs": [{"pixels": image.round(4).tolist()} for image in images], **(ask or {})}


def predict_phase(client: httpx.Client, images: np.ndarray, ask: dict[str, Any] | None = None) -> list[str]:
    ids = []
    for start in range(0, len(images), PER_REQUEST):
        response = client.post("/predict", json=pixels_body(images[start:start + PER_REQUEST], ask))
        assert response.status_code == 200, response.text
        ids.append(response.json()["id"])
    return ids


async def burst(url: str, images: np.ndarray, concurrency: int) -> list[int]:
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        responses = await asyncio.gather(*[client.post("/predict", json=pixels_body(images))
                                           for _ in range(concurrency)])
    return [r.status_code for r in responses]


def broken_version(repository: Path) -> None:
    """fashion-vit/2 with a manifest of an unknown major format: the server marks it unavailable and keeps
    serving version 1 (the not-ready alert and the model table need a version that is not ready)."""
    target = repository / "fashion-vit" / "2"
    target.mkdir()
    manifest = json.loads((WHOLE_STACK_DIRECTOR_DIR / "manifest.json").read_text())
    manifest.update(version="2", format_version="99.0")
    (target / "manifest.json").write_text(json.dumps(manifest))


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("monitoring")
    repository = tmp / "model_repository"
    shutil.copytree(WHOLE_STACK_DIRECTOR_DIR, repository / "fashion-vit" / "1")  # the server's default model
    with_conformal(repository / "fashion-vit" / "1")
    broken_version(repository)
    service_port, prometheus_port, alertmanager_port = free_port(), free_port(), free_port()
    env = {**os.environ,
           "DIRECTOR_HOST": "127.0.0.1", "DIRECTOR_PORT": str(service_port),
           "DIRECTOR_MODEL_REPOSITORY": str(repository), "DIRECTOR_FEEDBACK_DB": str(tmp / "feedback.sqlite3"),
           "DIRECTOR_TORCH_THREADS": "1", "DIRECTOR_POLL_INTERVAL_S": "0", "DIRECTOR_LOG_LEVEL": "warning",
           "DIRECTOR_DRIFT_MIN_WINDOW": "10", "DIRECTOR_MAX_QUEUE": "2"}
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(prometheus_config(service_port, prometheus_port,
                                                                         alertmanager_port)))
    prometheus_cmd = [tool("prometheus", "apt-get install prometheus"),
                      f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'tsdb'}",
                      f"--web.listen-address=127.0.0.1:{prometheus_port}", "--log.level=warn"]
    alertmanager_cmd = [tool("prometheus-alertmanager", "apt-get install prometheus-alertmanager"),
                        f"--config.file={ALERTMANAGER_CONFIG}", f"--storage.path={tmp / 'alertmanager'}",
                        f"--web.listen-address=127.0.0.1:{alertmanager_port}", "--cluster.listen-address=",
                        "--log.level=warn"]
    service_url, prometheus_url = f"http://127.0.0.1:{service_port}", f"http://127.0.0.1:{prometheus_port}"
    alertmanager_url = f"http://127.0.0.1:{alertmanager_port}"
    # the server runs the image's own command (ENTRYPOINT ["python", "-m", "service"]), configured by DIRECTOR_*
    with process_group(native(image_command("service")), env, tmp / "service.log") as server, \
            process_group(prometheus_cmd, dict(os.environ), tmp / "prometheus.log", cwd=tmp) as prometheus, \
            process_group(alertmanager_cmd, dict(os.environ), tmp / "alertmanager.log", cwd=tmp) as alerts:
        wait_http(f"{alertmanager_url}/-/ready", alerts, tmp / "alertmanager.log")
        wait_http(f"{prometheus_url}/-/ready", prometheus, tmp / "prometheus.log")
        wait_http(f"{service_url}/health/ready", server, tmp / "service.log")
        wait_for(prometheus_url, 'up{job="director"}', lambda v: v == [1.0])

        test = load_fashion_mnist_split(FASHION_ROOT, "test")
        in_distribution = test.images[:PHASE_IMAGES].numpy()
        labels = test.labels[:PHASE_IMAGES].tolist()
        noise = np.random.default_rng(0).random((PHASE_IMAGES, 1, 28, 28), dtype=np.float32)
        with httpx.Client(base_url=service_url, timeout=60) as client:
            ids = predict_phase(client, in_distribution, DECISIONS)
            wait_equal(prometheus_url, "sum(director_predictions_total)", PHASE_IMAGES)
            t_in_distribution = time.time()
            # a scrape after that instant, before the noise: a query at it reads the in-distribution phase alone
            wait_for(prometheus_url, "max(timestamp(director_predictions_total))", lambda v: v[0] > t_in_distribution)
            predict_phase(client, noise)
            wait_equal(prometheus_url, "sum(director_predictions_total)", 2 * PHASE_IMAGES)
            t_ood = time.time()
            for n in range(FEEDBACK):  # delayed ground truth for the first in-distribution predictions
                request, index = divmod(n, PER_REQUEST)
                response = client.post("/feedback", json={"id": ids[request], "index": index, "label": labels[n]})
                assert response.status_code == 200, response.text
        # one overload burst is enough: the server created director_rejected_requests_total{reason} at 0 for
        # every reason when the version loaded, so Prometheus has a 0 before the burst and rate() sees the rise
        refusals = 'director_rejected_requests_total{model="fashion-vit", version="1"}'
        assert sorted(values(query(prometheus_url, refusals))) == [0.0, 0.0, 0.0]  # queue_full, timeout, draining
        statuses = asyncio.run(burst(service_url, noise[:PER_REQUEST], concurrency=10))
        assert set(statuses) == {200, 503}, statuses  # a queue of 2: some served, the rest refused fast
        wait_equal(prometheus_url, 'sum(director_rejected_requests_total{reason="queue_full"})', statuses.count(503))
        wait_equal(prometheus_url, "sum(director_feedback_total)", FEEDBACK)
        wait_equal(prometheus_url, "sum(director_live_coverage_count)", FEEDBACK)  # every labelled input had a set
        wait_for(prometheus_url, "sum(director_live_selective_risk_count)", bool)  # answered ones among them
        wait_for(prometheus_url, 'ALERTS{alertname="DirectorQueueSaturated"}', bool)  # rules have seen it all
        # requests_total{code="503"} is created by the burst itself: wait for the second scrape that rate() needs
        wait_for(prometheus_url, 'rate(director_requests_total{endpoint="/predict", code="503"}[5m])', bool)

        resolved: dict[str, str] = {}
        for variable in variables():  # each dashboard variable's own query, with the variables before it
            selector, label = label_values_query(substitute(variable["query"]["query"], resolved))
            found = httpx.get(f"{prometheus_url}/api/v1/label/{label}/values", params={"match[]": selector},
                              timeout=30).json()["data"]
            assert found, f"variable {variable['name']}: no values for {selector}"
            resolved["$" + variable["name"]] = "|".join(found)
        yield Stack(service_url, service_port, prometheus_url, alertmanager_url, "fashion-vit", t_in_distribution,
                    t_ood, statuses.count(503), resolved)


def assert_has_data(stack: Stack, expression: Expression, expr: str) -> None:
    found = values(query(stack.prometheus_url, expr))
    assert found, f"{expression.where}: no data for {expr}"
    assert any(not math.isnan(v) for v in found), f"{expression.where}: only NaN for {expr}: {found}"


def test_dashboard_variables_resolve_to_the_served_model(stack: Stack) -> None:
    assert stack.variable_values == {"$model": "fashion-vit", "$version": "1"}


def test_every_dashboard_expression_returns_data(stack: Stack) -> None:
    expressions = dashboard_expressions()
    assert len(expressions) >= 40
    checked = 0
    for expression in expressions:
        expr = substitute(expression.expr, stack.variable_values)
        if GPU_METRIC in expr:
            # GPU memory cannot exist on this CPU-only machine: the server exports 0 there, and the panel shows
            # only values > 0 ("GPU memory when present"). Check the metric itself is scraped under that name.
            assert values(query(stack.prometheus_url, GPU_METRIC)) == [0.0]
            assert values(query(stack.prometheus_url, expr)) == []
            continue
        if GPU_DEVICE_METRIC in expr or GPU_TOTAL_METRIC in expr:
            # the device's used and total memory: families without samples on a CPU server (named in /metrics)
            assert values(query(stack.prometheus_url, expr)) == []
            continue
        assert_has_data(stack, expression, expr)
        checked += 1
    assert checked == len(expressions) - 3  # everything but the three GPU-memory queries
    metrics = httpx.get(f"{stack.service_url}/metrics").text
    assert f"# TYPE {GPU_DEVICE_METRIC} gauge" in metrics and f"# TYPE {GPU_TOTAL_METRIC} gauge" in metrics


def test_every_alert_expression_has_data_on_both_sides(stack: Stack) -> None:
    """An alert condition is empty while it holds no alarm, so each operand of its top-level comparisons and
    set operators is evaluated instead: the measured quantity and its threshold must both exist, otherwise the
    alert could never fire. ``absent(X)`` is quiet exactly when X has data, so X is checked."""
    expressions = alert_expressions()
    assert len(expressions) == 12
    for expression in expressions:
        sides = operands(expression.expr)
        assert len(sides) >= 2, expression
        for side in sides:
            if is_number(side):
                continue
            if GPU_DEVICE_METRIC in side:
                # no GPU here: the device-wide GPU memory families are exported without samples (checked by name)
                assert f"# TYPE {GPU_DEVICE_METRIC} gauge" in httpx.get(f"{stack.service_url}/metrics").text
                assert values(query(stack.prometheus_url, side)) == []
                continue
            if side.startswith("absent(") and side.endswith(")"):
                side = side[len("absent("):-1]
            assert_has_data(stack, expression, side)


# what only a multi-label version counts: this stack serves none, so the series recorded from it are evaluated on
# input series by promtool's unit tests instead (tests/deploy/test_prometheus_rules.py checks each has a case)
MULTI_LABEL_FEEDBACK = "director_feedback_label_decisions_total"


def test_every_recording_rule_has_data(stack: Stack) -> None:
    multi_label = {r["record"] for g in rule_groups() for r in g["rules"]
                   if "record" in r and MULTI_LABEL_FEEDBACK in r["expr"]}
    assert multi_label == {"director:live_label_accuracy:ratio_1d"}
    for record in recorded_series() - multi_label:
        found = values(query(stack.prometheus_url, record))
        assert found and all(not math.isnan(v) for v in found), record


def test_reference_values_are_the_manifest_s(stack: Stack) -> None:
    """The server exports the committed manifest's reference block for the ready version, and nothing for the
    broken version 2; the queue capacity is DIRECTOR_MAX_QUEUE."""
    reference = json.loads((WHOLE_STACK_DIRECTOR_DIR / "manifest.json").read_text())["reference"]
    v1 = '{model="fashion-vit", version="1"}'
    for metric, expected in [("director_reference_accuracy_ratio", reference["accuracy"]),
                             ("director_reference_ece_ratio", reference["ece"]),
                             ("director_reference_ood_ratio", reference["ood_rate"])]:
        assert values(query(stack.prometheus_url, metric + v1)) == [pytest.approx(expected, rel=1e-9)], metric
    levels = reference["quantile_levels"]
    median = values(query(stack.prometheus_url, 'director_reference_confidence_ratio{quantile="0.5", version="1"}'))
    assert median == [pytest.approx(reference["confidence_quantiles"][levels.index(0.5)], rel=1e-9)]
    assert values(query(stack.prometheus_url, "director_queue_capacity" + v1)) == [2.0]
    assert values(query(stack.prometheus_url, '{__name__=~"director_reference_.+|director_queue_capacity", '
                                             'version="2"}')) == []


def test_ood_rate_rises_with_ood_traffic(stack: Stack) -> None:
    """The dashboard's OOD-rate query: ~5% on Fashion-MNIST test images (95%-TPR thresholds), far more once
    uniform noise arrives (the manifest measured 54% of noise flagged)."""
    panel = next(p for p in panels() if p["title"] == "OOD rate per model")
    expr = substitute(panel["targets"][0]["expr"], stack.variable_values)
    before = values(query(stack.prometheus_url, expr, at=stack.t_in_distribution))
    after = values(query(stack.prometheus_url, expr, at=stack.t_ood))
    assert len(before) == len(after) == 1
    assert before[0] < 0.15, before
    assert after[0] > before[0] + 0.15 and after[0] > 0.2, (before, after)
    reference = values(query(stack.prometheus_url, substitute(panel["targets"][1]["expr"], stack.variable_values)))
    assert after[0] > 3 * reference[0]  # over the OOD alert's level
    print(f"OOD rate: {before[0]:.3f} in distribution, {after[0]:.3f} with noise (reference {reference[0]:.3f})")


def test_the_relative_ood_score_separates_the_traffic_in_prometheus(stack: Stack) -> None:
    """Scraped by Prometheus: the in-distribution phase and the noise phase each keep under 10% of their
    observations of ``director_ood_score_relative`` beyond its last finite bucket, and the noise's median lands in a
    higher bucket than the test images'. (Not necessarily above 1: this version flags about half of the noise, so its
    median sits near the threshold, on either side from one run to the next.)"""
    from service.observability.metrics import RELATIVE_OOD_BUCKETS

    def cumulative(at: float) -> dict[float, float]:
        data = query(stack.prometheus_url, 'sum by (le) (director_ood_score_relative_bucket{model="fashion-vit", '
                                           'version="1"})', at=at)
        return {float(item["metric"]["le"]): float(item["value"][1]) for item in data["result"]}

    before = dict.fromkeys((*RELATIVE_OOD_BUCKETS, math.inf), 0.0)
    id_inf, ood_inf, id_median, ood_median = separates_by_relative_score(
        before, cumulative(stack.t_in_distribution), cumulative(stack.t_ood))
    assert id_inf < 0.1 and ood_inf < 0.1, (id_inf, ood_inf)
    assert id_median < ood_median, (id_median, ood_median)


def test_alerts_follow_the_traffic(stack: Stack) -> None:
    """Pending (their `for` has not elapsed): OOD rate over 3x reference, queue-full refusals, the broken
    version 2. The server is up, so DirectorDown stays quiet."""
    active = {item["metric"]["alertname"]: item["metric"] for item in query(stack.prometheus_url, "ALERTS")["result"]}
    assert {"DirectorOodRateHigh", "DirectorQueueSaturated", "DirectorModelNotReady"} <= set(active), active
    assert active["DirectorModelNotReady"]["version"] == "2"
    assert active["DirectorModelNotReady"]["state"] == "unavailable"
    assert "DirectorDown" not in active


def test_dockerfile_healthcheck_runs_against_the_live_server(stack: Stack) -> None:
    command = native(healthcheck_command())
    ready = subprocess.run(command, env={**os.environ, "DIRECTOR_PORT": str(stack.service_port)},
                           capture_output=True, text=True, timeout=30)
    assert ready.returncode == 0, ready.stderr
    nothing_there = subprocess.run(command, env={**os.environ, "DIRECTOR_PORT": str(free_port())},
                                   capture_output=True, text=True, timeout=30)
    assert nothing_there.returncode == 1 and "Connection refused" in nothing_there.stderr


def test_prometheus_sends_alerts_to_the_alertmanager(stack: Stack) -> None:
    """The committed `alerting:` block (pointed at the test's Alertmanager, which runs the committed config): the
    Alertmanager is discovered and active, and it is ready."""
    found = httpx.get(f"{stack.prometheus_url}/api/v1/alertmanagers", timeout=30).json()["data"]
    assert [a["url"] for a in found["activeAlertmanagers"]] == [f"{stack.alertmanager_url}/api/v2/alerts"]
    assert httpx.get(f"{stack.alertmanager_url}/-/ready", timeout=10).status_code == 200
