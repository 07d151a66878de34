"""The Grafana provisioning and dashboard, statically: one fixed datasource uid everywhere, the files mounted
where the providers look, a sound layout, the panels operators need, and only metric names the server
really exports (test_monitoring_live.py then runs every query against a live Prometheus)."""

from __future__ import annotations

import re

import yaml
from prometheus_client.samples import Sample

from service.observability.metrics import Metrics
from tests.deploy.conftest import GRAFANA_PROVISIONING, PROMETHEUS_CONFIG, compose
from tests.deploy.promql import alert_expressions, dashboard, dashboard_expressions, panels, recorded_series, variables

REQUIRED_PANELS = [  # (what an operator looks for, a title that shows it)
    ("OOD rate per model", "OOD rate per model"),
    ("confidence distribution over time", "Confidence distribution"),
    ("entropy distribution over time", "Predictive entropy distribution"),
    ("MI distribution over time", "Mutual information distribution"),
    ("drift KS against threshold", "Confidence drift: KS distance"),
    ("drift PSI against threshold", "Confidence drift: PSI"),
    ("live accuracy against the reference", "Live accuracy vs reference"),
    ("live ECE against the reference", "Live ECE vs reference"),
    ("live coverage per level against its target", "Live coverage vs target"),
    ("live selective risk per max_risk against its bound", "Live selective risk vs bound"),
    ("with counts", "Labelled inputs behind live coverage and risk"),
    ("latency quantiles", "Request latency quantiles"),
    ("throughput", "Throughput"),
    ("batch size", "Batch size"),
    ("queue depth", "Queue depth and refusals"),
    ("GPU memory when present", "GPU memory allocated"),
    ("per-class prediction counter", "Predictions per class"),
    ("process collector", "Server processes: memory and CPU"),
]


def datasource() -> dict:
    path = GRAFANA_PROVISIONING / "datasources" / "prometheus.yml"
    return yaml.safe_load(path.read_text())["datasources"][0]


def exported_series() -> set[str]:
    """Every series name the server's registry can expose (histogram/counter suffixes included)."""
    names = set()
    for family in Metrics().registry.collect():
        names.add(family.name)
        suffixes = {"counter": ["_total", "_created"], "histogram": ["_bucket", "_count", "_sum", "_created"]}
        names.update(family.name + s for s in suffixes.get(family.type, []))
        names.update(sample.name for sample in family.samples if isinstance(sample, Sample))
    return names


def test_every_panel_uses_the_provisioned_datasource_uid() -> None:
    uid = datasource()["uid"]
    assert uid and datasource()["type"] == "prometheus"
    for panel in panels():
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": uid}, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == {"type": "prometheus", "uid": uid}, panel["title"]
    for variable in variables():
        assert variable["datasource"]["uid"] == uid


def test_provisioning_matches_the_compose_mounts_and_prometheus() -> None:
    grafana = compose()["services"]["grafana"]
    mounts = dict(volume.split(":")[:2] for volume in grafana["volumes"])
    assert mounts["./docker/grafana/provisioning"] == "/etc/grafana/provisioning"
    provider = yaml.safe_load((GRAFANA_PROVISIONING / "dashboards" / "director.yml").read_text())["providers"][0]
    assert mounts["./docker/grafana/dashboards"] == provider["options"]["path"]
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == provider["options"]["path"] + "/director.json"
    # the datasource URL is the compose Prometheus service on its container port
    assert datasource()["url"] == "http://prometheus:9090" and "prometheus" in compose()["services"]
    assert compose()["services"]["prometheus"]["ports"][0].endswith(":9090")
    # $__rate_interval assumes the real scrape interval
    scrape = yaml.safe_load(PROMETHEUS_CONFIG.read_text())["global"]["scrape_interval"]
    assert datasource()["jsonData"]["timeInterval"] == scrape


def test_dashboard_layout_is_sound() -> None:
    board = dashboard()
    assert board["uid"] and board["title"] and board["schemaVersion"] >= 36
    ids = [panel["id"] for panel in panels(board)]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for panel in panels(board):
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24 and pos["h"] > 0, panel["title"]
        taken = {(x, y) for x in range(pos["x"], pos["x"] + pos["w"]) for y in range(pos["y"], pos["y"] + pos["h"])}
        assert not cells & taken, f"{panel['title']} overlaps another panel"
        cells |= taken
        if panel["type"] != "row":
            assert panel.get("description"), panel["title"]
    for panel in panels(board):  # heatmaps read Prometheus buckets as they are
        if panel["type"] == "heatmap":
            assert panel["options"]["calculate"] is False
            assert panel["targets"][0]["format"] == "heatmap" and "_bucket" in panel["targets"][0]["expr"]


def test_the_issue_panels_are_there() -> None:
    titles = {panel["title"]: panel for panel in panels()}
    for wanted, title in REQUIRED_PANELS:
        assert title in titles, wanted
    # "against thresholds / the reference": those panels plot the threshold or reference series too
    for title, series in [("Confidence drift: KS distance", "director:threshold:drift_ks"),
                          ("Confidence drift: PSI", "director:threshold:drift_psi"),
                          ("Live accuracy vs reference", "director_reference_accuracy_ratio"),
                          ("Live ECE vs reference", "director_reference_ece_ratio"),
                          ("Live coverage vs target", "director_live_coverage_target_ratio"),
                          ("Live coverage vs target", "director:threshold:live_coverage_z"),
                          ("Live selective risk vs bound", "director_live_selective_risk_bound_ratio"),
                          ("Live selective risk vs bound", "director:threshold:live_selective_risk_z"),
                          ("Labelled inputs behind live coverage and risk", "director:threshold:min_decision_labels"),
                          ("OOD rate per model", "director_reference_ood_ratio"),
                          ("OOD flag threshold per model", "director_ood_threshold"),
                          ("Confidence quantiles vs reference", "director_reference_confidence_ratio"),
                          ("Predictive entropy quantiles vs reference", "director_reference_predictive_entropy_nats"),
                          ("Mutual information quantiles vs reference", "director_reference_mutual_information_nats"),
                          ("Queue depth and refusals", "director_queue_capacity"),
                          ("Request latency quantiles", "director:threshold:latency_p99_seconds")]:
        assert any(series in target["expr"] for target in titles[title]["targets"]), title


def test_ood_scores_are_drawn_per_model_relative_to_their_threshold() -> None:
    """Models' raw OOD scores have different scales: the heatmap draws the score relative to its threshold (one bucket
    layout for every model), repeated per model and never summed across, and a panel draws each model's median and
    p95 against a threshold line at 1."""
    (heatmap,) = [panel for panel in panels() if panel["title"].startswith("OOD score relative to its threshold: ")]
    assert heatmap["repeat"] == "model" and "$model" in heatmap["title"]
    assert heatmap["targets"][0]["expr"].startswith("sum by (le)")
    assert "director_ood_score_relative_bucket" in heatmap["targets"][0]["expr"]
    (lines,) = [panel for panel in panels() if panel["title"] == "OOD score relative to its threshold per model"]
    assert lines["fieldConfig"]["defaults"]["custom"]["thresholdsStyle"] == {"mode": "line"}
    assert [step["value"] for step in lines["fieldConfig"]["defaults"]["thresholds"]["steps"]] == [None, 1]


def test_queries_name_only_metrics_that_exist() -> None:
    """Every metric name in the dashboard and alert queries is exported by service/observability/metrics.py,
    recorded by our rule files, or a Prometheus built-in; a typo fails here before any live run."""
    known = exported_series() | recorded_series() | {"up", "ALERTS"}
    queries = [e.expr for e in dashboard_expressions() + alert_expressions()]
    queries += [v["query"]["query"] for v in variables()]
    names = set()
    for expr in queries:
        expr = re.sub(r'"[^"]*"', '""', expr)  # label values
        expr = re.sub(r"\{[^}]*\}", "", expr)  # selectors
        expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
        names |= {n for n in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", expr)
                  if n.startswith(("director", "up", "ALERTS"))}
    assert names, "no metric names found"
    assert names <= known, sorted(names - known)


def test_entropy_and_mutual_information_panels_are_in_nats() -> None:
    """The server exports entropies and mutual information in nats (natural log); every panel that plots them
    says so on its axis, and no other panel claims nats."""
    nats = "suffix: nats"
    plotted = 0
    for panel in panels():
        exprs = " ".join(target.get("expr", "") for target in panel.get("targets", []))
        in_nats = "_nats" in exprs
        if panel["type"] == "heatmap":
            unit = panel["options"]["yAxis"]["unit"]
        else:
            unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit")
        assert (unit == nats) == in_nats, (panel["title"], unit)
        plotted += in_nats
    assert plotted == 4  # two distributions (heatmaps) and two quantile panels


def test_ratio_gauges_are_named_ratio_and_plotted_as_percentages() -> None:
    """Gauges of a value in [0, 1] end in _ratio (Prometheus naming); the panels plotting them use percentunit."""
    ratio_gauges = {family.name for family in Metrics().registry.collect()
                    if family.type == "gauge" and family.name.endswith("_ratio")}
    assert ratio_gauges == {"director_live_accuracy_ratio", "director_live_ece_ratio", "director_live_coverage_ratio",
                            "director_live_coverage_target_ratio", "director_live_selective_risk_ratio",
                            "director_live_selective_risk_bound_ratio", "director_live_coverage_robust_ratio",
                            "director_live_selective_risk_robust_ratio",
                            "director_reference_accuracy_ratio", "director_reference_ece_ratio",
                            "director_reference_ood_ratio", "director_reference_confidence_ratio",
                            "director_gpu_utilization_ratio"}
    for panel in panels():
        exprs = " ".join(target.get("expr", "") for target in panel.get("targets", []))
        if any(name in exprs for name in ratio_gauges):
            assert panel["fieldConfig"]["defaults"]["unit"] == "percentunit", panel["title"]
