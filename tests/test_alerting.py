"""The generated rules and dashboards: promtool accepts them, every alert is unit-tested both ways,
annotated and documented, and the generator config really drives them."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import yaml

from checkpoint_exporter import dashboards, rules
from checkpoint_exporter.mixin import ALERTS, MixinConfig
from tests.conftest import REPO, require_tool, run_cli, write_config

RULES = REPO / "alerts" / "checkpoint-exporter.rules.yaml"
TESTS = sorted((REPO / "alerts" / "tests").glob("*.yaml"))


def alerts() -> dict[str, dict]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return {rule["alert"]: rule for group in groups for rule in group["rules"] if "alert" in rule}


def test_promtool_checks_and_unit_tests_pass() -> None:
    promtool = require_tool("promtool")
    check = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    assert (
        f"SUCCESS: {len(ALERTS) + len(rules._recording(MixinConfig()))} rules found" in check.stdout
    )
    tested = subprocess.run(
        [promtool, "test", "rules", *map(str, TESTS)], capture_output=True, text=True, timeout=120
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_every_alert_has_a_firing_and_a_quiet_unit_test() -> None:
    firing: set[str] = set()
    quiet: set[str] = set()
    for path in TESTS:
        for test in yaml.safe_load(path.read_text())["tests"]:
            for case in test.get("alert_rule_test", []):
                (firing if case.get("exp_alerts") else quiet).add(case["alertname"])
    assert firing == set(ALERTS), set(ALERTS) - firing
    assert quiet == set(ALERTS), set(ALERTS) - quiet


def test_every_alert_is_annotated_and_has_a_runbook_section() -> None:
    runbooks = (REPO / "docs" / "runbooks.md").read_text()
    sections = dict(re.findall(r"^## (\w+)\n(.*?)(?=^## |\Z)", runbooks, re.M | re.S))
    assert set(alerts()) == set(ALERTS) == set(sections)
    for name, rule in alerts().items():
        assert rule["labels"]["severity"] in ("critical", "warning")
        summary = rule["annotations"]["summary"]
        assert summary[0].isupper() and summary.endswith(".") and summary.count(". ") == 0
        assert "{{ $labels." in rule["annotations"]["description"]
        assert rule["annotations"]["runbook_url"].endswith(f"docs/runbooks.md#{name.lower()}")
        for part in (
            "**Meaning.**",
            "**First evidence.**",
            "**Controlled next test.**",
            "**Silence safely.**",
        ):
            assert part in sections[name], f"{name}: {part}"


def test_thresholds_come_from_the_exported_objectives() -> None:
    expressions = {name: rule["expr"] for name, rule in alerts().items()}
    assert rules.INTERVAL in expressions["CheckpointTooOld"]
    assert rules.DEADLINE in expressions["CheckpointTooOld"]
    assert rules.DEADLINE in expressions["CheckpointSaveHung"]
    assert (
        "checkpoint_restore_drill_max_age_seconds" in expressions["CheckpointRestoreDrillOverdue"]
    )
    assert rules.RETAINED_LIMIT in expressions["CheckpointRetentionExceeded"]
    assert (
        "checkpoint_deadline_bucket_info" in RULES.read_text()
    )  # the SLO's bucket is the deadline
    for name, expr in expressions.items():
        # No durations or byte counts written into a rule: numbers are factors, not limits.
        assert not re.search(r"\b\d{3,}\b", expr), f"{name} hard-codes a threshold: {expr}"


def test_the_mixin_config_drives_the_output(tmp_path: Path) -> None:
    mixin = write_config(
        tmp_path,
        'selector: job="ckpt"\nrunbook_url: https://wiki.example/runbooks\nslo_target: 0.995\n'
        "severity: {CheckpointSaveAborted: critical}\nfor: {CheckpointTooOld: 1m}\n",
        "mixin.yaml",
    )
    result = run_cli(
        "rules", "--config.file", str(mixin), "--output-dir", str(tmp_path / "out"),
        "--kubernetes-dir", str(tmp_path / "k8s"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    groups = yaml.safe_load((tmp_path / "out" / "checkpoint-exporter.rules.yaml").read_text())
    generated = {r["alert"]: r for g in groups["groups"] for r in g["rules"] if "alert" in r}
    assert generated["CheckpointSaveAborted"]["labels"]["severity"] == "critical"
    assert generated["CheckpointTooOld"]["for"] == "1m"
    assert 'job="ckpt"' in generated["CheckpointInvalid"]["expr"]
    assert generated["CheckpointInvalid"]["annotations"]["runbook_url"] == (
        "https://wiki.example/runbooks#checkpointinvalid"
    )
    assert "0.015" in generated["CheckpointDeadlineBudgetBurn"]["expr"]  # 3 x (1 - 0.995)
    manifest = yaml.safe_load((tmp_path / "k8s" / "prometheusrule.yaml").read_text())
    assert manifest["kind"] == "PrometheusRule" and manifest["spec"] == groups
    bad = write_config(
        tmp_path, "severity: {CheckpointTooOlde: critical}\nslo_taget: 0.9\n", "bad.yaml"
    )
    result = run_cli("rules", "--config.file", str(bad), "--output-dir", str(tmp_path / "x"))
    assert result.returncode == 2
    assert (
        "did you mean 'CheckpointTooOld'?" in result.stderr
        and "did you mean 'slo_target'?" in result.stderr
    )


def test_dashboards_have_the_template_variables_and_panels(tmp_path: Path) -> None:
    result = run_cli("dashboards", "--output-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    for uid in dashboards.DASHBOARDS:
        generated = json.loads((tmp_path / f"{uid}.json").read_text())
        committed = json.loads((REPO / "dashboards" / f"{uid}.json").read_text())
        assert generated == committed
        variables = [v["name"] for v in generated["templating"]["list"]]
        assert variables == ["datasource", "cluster", "training_job"]
        panels = [p for p in generated["panels"] if p["type"] != "row"]
        assert panels and all(p["targets"] and p["datasource"] == "${datasource}" for p in panels)
        ids = [p["id"] for p in generated["panels"]]
        assert len(ids) == len(set(ids))
    queries = dashboards.queries()
    assert all('training_job=~"$training_job"' in q or "mountpoint" in q or "filesystem" in q
               for _, _, q in queries)  # fmt: skip
