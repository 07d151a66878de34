"""promtool on the committed Prometheus files: config and rule syntax, the alert unit tests, and the reference
rules generated from the model repository's manifests."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from types import ModuleType

import yaml

from tests.deploy.conftest import (
    DEFAULT_MODEL_DIR,
    PROMETHEUS_CONFIG,
    PROMETHEUS_DIR,
    REPO_ROOT,
    RULE_TESTS,
    RULES_DIR,
    promtool,
    run_tool,
)

ALERTS = {"DirectorOodRateHigh", "DirectorConfidenceDrift", "DirectorLatencyP99High", "DirectorHighErrorRatio",
          "DirectorModelNotReady", "DirectorDown", "DirectorQueueSaturated"}


def reference_rules() -> ModuleType:
    spec = importlib.util.spec_from_file_location("reference_rules", PROMETHEUS_DIR / "reference_rules.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
    assert {Path(f).name for f in files} == {"alerts.yml", "reference.yml", "thresholds.yml"}
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
    fires = {t["alertname"] for c in cases for t in c["alert_rule_test"] if t["exp_alerts"]}
    quiet = {t["alertname"] for c in cases for t in c["alert_rule_test"] if not t["exp_alerts"]}
    assert fires == ALERTS and quiet == ALERTS


def test_thresholds_live_in_one_place(tmp_path: Path) -> None:
    """Raising the OOD factor in thresholds.yml alone silences the OOD alert in the unit tests: the alert reads
    the threshold series, it has no number of its own."""
    copy = tmp_path / "prometheus"
    shutil.copytree(PROMETHEUS_DIR, copy, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    thresholds = copy / "rules" / "thresholds.yml"
    text = thresholds.read_text()
    factor = "record: director:threshold:ood_rate_factor\n        expr: vector({})"
    assert factor.format(3) in text
    thresholds.write_text(text.replace(factor.format(3), factor.format(10)))
    result = run_tool([promtool(), "test", "rules", str(copy / "tests" / "alerts.test.yml")])
    assert result.returncode != 0
    assert "alertname: DirectorOodRateHigh" in result.stdout + result.stderr
    assert "DirectorConfidenceDrift" not in result.stdout + result.stderr  # only the OOD cases changed


def test_reference_rules_match_the_committed_manifests() -> None:
    module = reference_rules()
    committed = (RULES_DIR / "reference.yml").read_text()
    assert module.render(REPO_ROOT / "model_repository") == committed, \
        "run: python docker/prometheus/reference_rules.py"
    manifest = json.loads((DEFAULT_MODEL_DIR / "manifest.json").read_text())
    rules = yaml.safe_load(committed)["groups"][0]["rules"]
    by_record = {(r["record"], r["labels"].get("quantile")): r for r in rules
                 if (r["labels"]["model"], r["labels"]["version"]) == ("fashion-vit", "1")}
    assert by_record[("director:reference_accuracy", None)]["expr"] == \
        f"vector({manifest['reference']['accuracy']:.6g})"
    assert by_record[("director:reference_ece", None)]["expr"] == f"vector({manifest['reference']['ece']:.6g})"
    ood = float(by_record[("director:reference_ood_rate", None)]["expr"][7:-1])
    assert abs(ood - manifest["reference"]["ood_rate"]) < 1e-5 and 0.03 < ood < 0.08  # ~5% at 95% TPR
    median = float(by_record[("director:reference_confidence", "0.5")]["expr"][7:-1])
    levels, quantiles = manifest["reference"]["quantile_levels"], manifest["reference"]["confidence_quantiles"]
    assert abs(median - quantiles[levels.index(0.5)]) < 1e-5


def test_reference_rules_cli_check_and_stdout(tmp_path: Path) -> None:
    module = reference_rules()
    stale = tmp_path / "reference.yml"
    stale.write_text("groups: []\n")
    assert module.main(["--check", "--output", str(stale)]) == 1
    assert module.main(["--output", str(stale)]) == 0
    assert module.main(["--check", "--output", str(stale)]) == 0
    # a repository with a second version (no reference block) gets the 1 - TPR fallback for its OOD rate
    repo = tmp_path / "repo"
    (repo / "m" / "7").mkdir(parents=True)
    (repo / "m" / "7" / "manifest.json").write_text(json.dumps({"name": "m", "version": "7", "ood": {"tpr": 0.9}}))
    (repo / "m" / ".8.tmp").mkdir()  # a version being published is skipped
    (repo / "m" / ".8.tmp" / "manifest.json").write_text("{")
    rules = yaml.safe_load(module.render(repo))["groups"][0]["rules"]
    assert rules == [{"record": "director:reference_ood_rate", "expr": "vector(0.1)",
                      "labels": {"model": "m", "version": "7"}}]
