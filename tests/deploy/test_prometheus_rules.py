"""promtool on the committed Prometheus files: config and rule syntax, and the alert unit tests."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from tests.deploy.conftest import PROMETHEUS_CONFIG, PROMETHEUS_DIR, RULE_TESTS, RULES_DIR, promtool, run_tool

ALERTS = {"DirectorOodRateHigh", "DirectorConfidenceDrift", "DirectorLatencyP99High", "DirectorHighErrorRatio",
          "DirectorModelNotReady", "DirectorDown", "DirectorQueueSaturated", "DirectorLiveAccuracyLow",
          "DirectorLiveEceHigh", "DirectorGpuMemoryHigh", "DirectorLiveCoverageLow", "DirectorLiveSelectiveRiskHigh"}


def alert_rules() -> dict[str, dict]:
    groups = yaml.safe_load((RULES_DIR / "alerts.yml").read_text())["groups"]
    return {rule["alert"]: rule for group in groups for rule in group["rules"] if "alert" in rule}


def test_promtool_check_config() -> None:
    result = run_tool([promtool(), "check", "config", str(PROMETHEUS_CONFIG)])
    assert result.returncode == 0, result.stdout + result.stderr
    # the config's rule_files glob picks up every committed rule file (promtool checks each one it loads)
    assert "3 rule files found" in result.stdout
    for path in RULES_DIR.glob("*.yml"):
        assert f"{path.name}\n  SUCCESS" in result.stdout, path


def test_promtool_check_rules() -> None:
    files = sorted(str(p) for p in RULES_DIR.glob("*.yml"))
    # references are server gauges; live.yml records what the server counts but holds as no gauge
    assert {Path(f).name for f in files} == {"alerts.yml", "thresholds.yml", "live.yml"}
    result = run_tool([promtool(), "check", "rules", *files])
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(files)


def test_the_issue_alerts_are_all_defined_with_severity_and_summary() -> None:
    rules = alert_rules()
    assert set(rules) == ALERTS
    assert rules["DirectorOodRateHigh"]["for"] == "10m"  # "OOD rate above its reference for 10 minutes"
    for name, rule in rules.items():
        assert rule["labels"]["severity"] in {"warning", "critical"}, name
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], name


def test_promtool_rule_unit_tests_fire_and_stay_quiet() -> None:
    result = run_tool([promtool(), "test", "rules", str(RULE_TESTS)])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
    # every alert has a case where it fires (exp_alerts listed) and one where it must stay quiet (exp_alerts: [])
    cases = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    fires = {t["alertname"] for c in cases for t in c.get("alert_rule_test", []) if t["exp_alerts"]}
    quiet = {t["alertname"] for c in cases for t in c.get("alert_rule_test", []) if not t["exp_alerts"]}
    assert fires == ALERTS and quiet == ALERTS
    # and every recording rule has a case that evaluates it
    recorded = {rule["record"] for group in yaml.safe_load((RULES_DIR / "live.yml").read_text())["groups"]
                for rule in group["rules"]}
    assert recorded <= {t["expr"] for c in cases for t in c.get("promql_expr_test", [])}


@pytest.mark.parametrize(("record", "value", "changed", "alert"), [
    ("ood_rate_factor", "3", "10", "DirectorOodRateHigh"),
    # a ratio of the exported capacity, not a depth: at 0.99 the 98%-full queue of the unit tests is quiet
    ("queue_saturation", "0.8", "0.99", "DirectorQueueSaturated"),
    ("live_accuracy_drop", "0.05", "0.2", "DirectorLiveAccuracyLow"),
    ("live_ece_rise", "0.05", "0.1", "DirectorLiveEceHigh"),
    ("gpu_memory_ratio", "0.9", "0.95", "DirectorGpuMemoryHigh"),
    # a number of standard errors: at 10 neither the coverage nor the risk that fire at 3 is beyond chance
    ("live_coverage_z", "3", "10", "DirectorLiveCoverageLow"),
    ("live_selective_risk_z", "3", "10", "DirectorLiveSelectiveRiskHigh"),
])
def test_thresholds_live_in_one_place(tmp_path: Path, record: str, value: str, changed: str, alert: str) -> None:
    """Raising one threshold in thresholds.yml alone silences its alert in some unit-test case: the alert reads
    the threshold series, it has no number of its own."""
    copy = tmp_path / "prometheus"
    shutil.copytree(PROMETHEUS_DIR, copy, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    thresholds = copy / "rules" / "thresholds.yml"
    text = thresholds.read_text()
    line = f"record: director:threshold:{record}\n        expr: vector({{}})"
    assert line.format(value) in text
    thresholds.write_text(text.replace(line.format(value), line.format(changed)))
    result = run_tool([promtool(), "test", "rules", str(copy / "tests" / "alerts.test.yml")])
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert f"alertname: {alert}" in output
    assert all(f"alertname: {other}" not in output for other in ALERTS - {alert})  # only its cases changed
