"""The generated rules and dashboards: promtool accepts them, every alert is unit-tested both ways,
annotated and documented with a link that resolves, the generator config really drives them, the
rules split by where they evaluate, and the generators write only where they are told."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from checkpoint_exporter.mixin import dashboards, rules
from checkpoint_exporter.mixin.config import (
    ALERTS,
    RUNBOOK_URL,
    SPLIT,
    MixinConfig,
    load_mixin,
)
from checkpoint_exporter.model import SYMPTOMS
from checkpoint_exporter.schema import ConfigError
from checkpoint_exporter.units import parse_duration
from tests.conftest import REPO, require_tool, run_cli, write_config

pytestmark = [pytest.mark.prometheus]

RULES = REPO / "alerts" / "checkpoint-exporter.rules.yaml"
NODE_RULES = REPO / "alerts" / "split" / "checkpoint-exporter-node.rules.yaml"
JOB_RULES = REPO / "alerts" / "split" / "checkpoint-exporter-job.rules.yaml"
TESTS = sorted((REPO / "alerts" / "tests").glob("*.yaml"))


def alerts() -> dict[str, dict]:
    """Each alert's first rule: the paging one, where a job's alert also has a ticket rule."""
    return {name: found[0] for name, found in all_rules().items()}


def all_rules() -> dict[str, list[dict]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    out: dict[str, list[dict]] = {}
    for rule in (r for group in groups for r in group["rules"] if "alert" in r):
        out.setdefault(rule["alert"], []).append(rule)
    return out


def rule_count(path: Path) -> int:
    return sum(len(group["rules"]) for group in yaml.safe_load(path.read_text())["groups"])


def test_promtool_checks_and_unit_tests_pass(tmp_path: Path) -> None:
    promtool = require_tool("promtool")
    for path in (RULES, NODE_RULES, JOB_RULES):
        check = subprocess.run(
            [promtool, "check", "rules", str(path)], capture_output=True, text=True
        )
        assert check.returncode == 0, check.stdout + check.stderr
        assert f"SUCCESS: {rule_count(path)} rules found" in check.stdout
    assert rule_count(NODE_RULES) + rule_count(JOB_RULES) == rule_count(RULES) > len(ALERTS)
    # As committed, each test file runs against the split file that holds its rules alone; then
    # every one of them again against the single file, the one-Prometheus shape.
    single = []
    for path in TESTS:
        test = yaml.safe_load(path.read_text())
        test["rule_files"] = [str(RULES)]
        (tmp_path / path.name).write_text(yaml.safe_dump(test))
        single.append(tmp_path / path.name)
    # Both at once (each takes about 35 s of one core); the timeout is a hang detector, wide
    # enough for a CI machine running three test files at a time.
    runs = [
        subprocess.Popen(
            [promtool, "test", "rules", *map(str, files)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for files in (TESTS, single)
    ]
    try:
        for run in runs:
            stdout, stderr = run.communicate(timeout=240)
            assert run.returncode == 0, stdout + stderr
    finally:
        for run in runs:
            run.kill()
            run.wait()


def groups_of(path: Path) -> list[dict]:
    return yaml.safe_load(path.read_text())["groups"]


def test_the_split_files_hold_the_single_files_groups_each_where_it_can_evaluate() -> None:
    """Per-node groups read one exporter's series and keep its instance, so any Prometheus shard
    evaluates them; per-job groups reduce every exporter's view of a job. Neither reads the
    other's recorded series: a shard has no per-job records, a global ruler need not have the
    shards' records."""
    node, job = groups_of(NODE_RULES), groups_of(JOB_RULES)
    assert node + job == groups_of(RULES)
    assert [g["name"] for g in node] == [
        "checkpoint-exporter.node.daily",
        "checkpoint-exporter.node.rules",
        "checkpoint-exporter.node.alerts",
    ]
    assert [g["name"] for g in job] == [
        "checkpoint-exporter.job.daily",
        "checkpoint-exporter.job.rules",
        "checkpoint-exporter.job.alerts",
    ]
    node_alerts = {r["alert"] for g in node for r in g["rules"] if "alert" in r}
    assert node_alerts == rules.NODE_ALERTS
    recorded = {
        scope: {r["record"] for g in groups for r in g["rules"] if "record" in r}
        for scope, groups in (("node", node), ("job", job))
    }
    for scope, groups, other in (("node", node, recorded["job"]), ("job", job, recorded["node"])):
        for rule in (r for g in groups for r in g["rules"]):
            name = rule.get("record") or rule["alert"]
            assert not [r for r in other if r in rule["expr"]], (
                f"{scope} {name} reads the other scope"
            )
            if scope == "node":
                for labels in re.findall(r"\b(?:by|on) \(([^)]*)\)", rule["expr"]):
                    assert "instance" in labels, f"{name} aggregates across exporters: {labels}"
    # Every alert on a job as a whole is per job: the ones that deduplicate across nodes.
    for name in rules.NODE_ALERTS:
        assert "by (cluster, training_job)" not in alerts()[name]["expr"], name


def test_each_promtool_test_file_runs_against_one_scope() -> None:
    """A node alert tested against the per-node file alone proves it needs nothing per job."""
    for path in TESTS:
        test = yaml.safe_load(path.read_text())
        (rule_file,) = test["rule_files"]
        scope = "node" if rule_file.endswith("-node.rules.yaml") else "job"
        assert rule_file == f"../split/checkpoint-exporter-{scope}.rules.yaml", path.name
        tested = {case["alertname"] for t in test["tests"] for case in t.get("alert_rule_test", [])}
        assert tested <= (rules.NODE_ALERTS if scope == "node" else set(ALERTS) - rules.NODE_ALERTS)


def test_the_split_layout_is_chosen_by_the_mixin_config(tmp_path: Path) -> None:
    mixin = write_config(tmp_path, "rule_layout: split\n", "mixin.yaml")
    assert load_mixin(str(mixin)).rule_layout == SPLIT
    result = run_cli(
        "rules", "--config.file", str(mixin), "--output-dir", str(tmp_path / "out"),
        "--kubernetes-dir", str(tmp_path / "k8s"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    written = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert written == ["checkpoint-exporter-job.rules.yaml", "checkpoint-exporter-node.rules.yaml"]
    for scope in ("node", "job"):
        path = tmp_path / "out" / f"checkpoint-exporter-{scope}.rules.yaml"
        assert path.read_text() == (REPO / "alerts" / "split" / path.name).read_text()
        manifest = yaml.safe_load((tmp_path / "k8s" / f"prometheusrule-{scope}.yaml").read_text())
        assert manifest["spec"] == yaml.safe_load(path.read_text())
        labels = manifest["metadata"]["labels"]
        assert labels["checkpoint-exporter/rules"] == scope
        # Both with the labels a default install's one Prometheus selects (docs/kubernetes.md:
        # job_rule_labels sets the per-job ones apart for a ThanosRuler).
        assert labels.items() >= MixinConfig().rule_labels.items()
    assert sorted(p.name for p in (tmp_path / "k8s").iterdir()) == [
        "prometheusrule-job.yaml", "prometheusrule-node.yaml",
    ]  # fmt: skip


def test_every_alert_has_a_firing_and_a_quiet_unit_test() -> None:
    firing: set[str] = set()
    quiet: set[str] = set()
    for path in TESTS:
        for test in yaml.safe_load(path.read_text())["tests"]:
            for case in test.get("alert_rule_test", []):
                (firing if case.get("exp_alerts") else quiet).add(case["alertname"])
    assert firing == set(ALERTS), set(ALERTS) - firing
    assert quiet == set(ALERTS), set(ALERTS) - quiet


# Each alert's runbook section: what the on-call needs at 3 a.m. first (what is at risk, what
# to paste, whom to wake), then what to read in daylight, in this order.
RUNBOOK_PARTS = (
    "**Impact.**",
    "**Do now.**",
    "**Escalate to.**",
    "**Meaning.**",
    "**First evidence.**",
    "**Controlled next test.**",
    "**Silence safely.**",
)


def runbook_sections() -> dict[str, str]:
    runbooks = (REPO / "docs" / "runbooks.md").read_text()
    return dict(re.findall(r"^## (\w+)\n(.*?)(?=^## |\Z)", runbooks, re.M | re.S))


def test_every_alert_is_annotated_and_has_a_runbook_section() -> None:
    sections = runbook_sections()
    assert set(alerts()) == set(ALERTS) == set(sections)
    for name, rule in alerts().items():
        assert rule["labels"]["severity"] in ("critical", "warning")
        summary = rule["annotations"]["summary"]
        assert summary[0].isupper() and summary.endswith(".") and summary.count(". ") == 0
        assert "$labels." in rule["annotations"]["description"]
        assert rule["annotations"]["runbook_url"] == MixinConfig().runbook(name)
        at = [sections[name].find(part) for part in RUNBOOK_PARTS]
        assert -1 not in at, f"{name}: no {RUNBOOK_PARTS[at.index(-1)]}"
        assert at == sorted(at), f"{name}: the parts are not in the order {RUNBOOK_PARTS}"


def test_each_runbook_section_opens_with_the_alerts_severity() -> None:
    """The first line says whether it pages, as ALERTS has it; a job's paging alert says that
    it tickets for a job that does not run or whose objectives nobody stated."""
    for name, section in runbook_sections().items():
        first = section.strip().split("\n\n")[0].replace("\n", " ")
        severity = ALERTS[name][0]
        opening = "**Pages** (critical)" if severity == "critical" else "**Ticket** (warning)."
        assert first.startswith(opening), f"{name}: {first!r}"
        if name in rules.PAGING_ALERTS:
            assert first.endswith("while the job runs and its objectives were stated; otherwise "
                                  "a ticket (warning)."), f"{name}: {first!r}"  # fmt: skip
        elif severity == "critical" and name != "CheckpointDeadlineBudgetBurn":
            assert first == "**Pages** (critical).", f"{name}: {first!r}"


def test_thresholds_come_from_the_exported_objectives() -> None:
    expressions = {name: rule["expr"] for name, rule in alerts().items()}
    assert rules.INTERVAL in expressions["CheckpointTooOld"]
    assert rules.DEADLINE in expressions["CheckpointTooOld"]
    assert rules.DEADLINE in expressions["CheckpointSaveHung"]
    assert (
        "checkpoint_restore_drill_max_age_seconds" in expressions["CheckpointRestoreDrillOverdue"]
    )
    assert rules.RETAINED_LIMIT in expressions["CheckpointRetentionExceeded"]
    # The SLO counts saves against each job's own deadline, as the exporter judged them.
    assert "checkpoint_saves_within_deadline_total" in RULES.read_text()
    # The one limit the mixin config sets itself: how old a job's view may get.
    stale_after = f"> {parse_duration(MixinConfig().stale_after):g}"
    assert f"{stale_after}\n" in expressions["CheckpointDataStale"]
    # The liveness settings of the mixin config: how long heartbeats may pause, and a finished
    # job's other ranks may take to exit.
    # And how long an open upload may stand still.
    keys = ("heartbeat_timeout", "finished_grace", "incomplete_upload_max_age")
    settings = [f"{parse_duration(getattr(MixinConfig(), key)):g}" for key in keys]
    for name, expr in expressions.items():
        # No durations or byte counts written into a rule: numbers are factors, not limits.
        expr = expr.replace(stale_after, "")
        for setting in settings:
            expr = re.sub(rf"[<>+] {setting}\b", "", expr)
        assert not re.search(r"\b\d{3,}\b", expr), f"{name} hard-codes a threshold: {expr}"


def github_anchor(heading: str) -> str:
    """The id GitHub gives a Markdown heading: lower case, punctuation dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_runbook_url_resolves_by_default() -> None:
    """The default links go to docs/runbooks.md where the project publishes it (GitHub gives
    each heading the id they name), at an anchor that exists; /runbooks on each exporter serves
    the same file with the same ids, for a link inside the cluster."""
    runbooks = (REPO / "docs" / "runbooks.md").read_text()
    anchors = {github_anchor(h) for h in re.findall(r"^#{1,6} (.+)$", runbooks, re.M)}
    for name, rule in alerts().items():
        base, _, anchor = rule["annotations"]["runbook_url"].partition("#")
        assert base == RUNBOOK_URL and base.endswith("/docs/runbooks.md"), name
        assert anchor in anchors, f"{name}: no heading in docs/runbooks.md has the id {anchor!r}"
    # Each symptom of a save links to its section of the matrix (the metric's help, the
    # acceptance report): first evidence and the controlled next test.
    for symptom in SYMPTOMS:
        assert f"symptom-{symptom}" in anchors, symptom
        section = runbooks.partition(f"### Symptom: {symptom}\n")[2].partition("\n### ")[0]
        assert "**First evidence.**" in section and "**Controlled next test.**" in section, symptom
    # What /runbooks serves is the package's copy, which `make generate` keeps identical.
    assert (REPO / "exporter" / "checkpoint_exporter" / "runbooks.md").read_text() == runbooks


def test_the_mixin_config_drives_the_output(tmp_path: Path) -> None:
    mixin = write_config(
        tmp_path,
        'selector: job="ckpt"\nrunbook_url: https://wiki.example/runbooks\nslo_target: 0.995\n'
        "severity: {CheckpointSaveAborted: critical}\nfor: {CheckpointTooOld: 1m}\n"
        "stale_after: 2m\n",
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
    burns = [r for g in groups["groups"] for r in g["rules"] if r.get("alert", "").endswith("Burn")]
    assert "> 0.015\n" in burns[1]["expr"]  # the 1d window's: 3 x (1 - 0.995)
    for name in ("CheckpointDataStale", "CheckpointTooOld", "CheckpointSaveHung"):
        assert "> 120" in generated[name]["expr"], name  # stale_after, and what holds back on it
    manifest = yaml.safe_load((tmp_path / "k8s" / "prometheusrule.yaml").read_text())
    assert manifest["kind"] == "PrometheusRule" and manifest["spec"] == groups
    bad = write_config(
        tmp_path,
        "severity: {CheckpointTooOlde: critical}\nslo_taget: 0.9\nstale_after: soon\n",
        "bad.yaml",
    )
    result = run_cli("rules", "--config.file", str(bad), "--output-dir", str(tmp_path / "x"))
    assert result.returncode == 2
    assert (
        "did you mean 'CheckpointTooOld'?" in result.stderr
        and "did you mean 'slo_target'?" in result.stderr
        and "stale_after" in result.stderr
    )


# Each mixin setting refused, and the start of its problem as printed (the schema may add the
# value after it): these are the messages users have seen, kept through the move to the schema.
MIXIN_PROBLEMS = [
    ("selector: ''", "selector: expected a non-empty string"),
    ("runbook_url: 3", "runbook_url: expected a non-empty string"),
    ("cluster_label: [a]", "cluster_label: expected a non-empty string"),
    ("slo_target: 1", "slo_target: must be a number between 0 and 1"),
    ("straggler_fraction: true", "straggler_fraction: must be a number between 0 and 1"),
    ("event_window: 0s", "event_window: must be greater than zero"),
    ("stale_after: soon", "stale_after: invalid duration 'soon'"),
    ("drain_margin: 0.9", "drain_margin: must be a number of at least 1"),
    ("rule_layout: both", "rule_layout: must be one of single, split; got 'both'"),
    ("severity: [CheckpointTooOld]", "severity: expected a mapping of alert name to value"),
    (
        "severity: {CheckpointTooOld: page}",
        "severity: CheckpointTooOld: severity must be critical, warning or info",
    ),
    (
        "for: {CheckpointTooOlde: 1m}",
        "for: unknown alert 'CheckpointTooOlde'; did you mean 'CheckpointTooOld'?",
    ),
    ("for: {CheckpointTooOld: 1m, CheckpointInvalid: x}", "for: CheckpointInvalid: invalid"),
    ("slo_taget: 0.9", "slo_taget: unknown key; did you mean 'slo_target'?"),
]


def test_every_bad_mixin_setting_is_named_on_its_line(tmp_path: Path) -> None:
    mixin = tmp_path / "mixin.yaml"
    for setting, expected in MIXIN_PROBLEMS:
        mixin.write_text(f"# the mixin config\n\n{setting}\n")
        with pytest.raises(ConfigError) as caught:
            load_mixin(str(mixin))
        (found,) = (str(problem) for problem in caught.value.problems)
        assert found.startswith(f"{mixin}:3: {expected}"), found


def test_mixin_durations_must_be_strings_prometheus_reads(tmp_path: Path) -> None:
    """A bare number passed parse_duration but was printed as it stood: `event_window: 5` made
    the generator fail with a TypeError, `for: {...: 5}` wrote `for: 5`, which Prometheus
    refuses. Both are named in the mixin config instead."""
    for setting, named in (
        ("event_window: 5", "event_window"),
        ("stale_after: 90", "stale_after"),
        ("for: {CheckpointTooOld: 5}", "for: CheckpointTooOld"),
    ):
        mixin = write_config(tmp_path, setting + "\n", "mixin.yaml")
        result = run_cli("rules", "--config.file", str(mixin), "--output-dir", str(tmp_path / "x"))
        assert result.returncode == 2, (setting, result.stderr)
        assert f"{mixin}:1: {named}: expected a duration such as 90s" in result.stderr, setting
        assert "Traceback" not in result.stderr


def test_mixin_values_reach_the_rules_as_written(tmp_path: Path) -> None:
    """No parser turns 2 into 2.0 or 1h into 3600.0: the rules print the value as given."""
    mixin = write_config(
        tmp_path,
        "drain_margin: 2\nevent_window: 1h\nstale_after: 2m\nslo_target: 0.995\n"
        "severity: {CheckpointSaveAborted: info}\nfor: {CheckpointTooOld: 90s}\n",
        "mixin.yaml",
    )
    config = load_mixin(str(mixin))
    assert config == MixinConfig(
        drain_margin=2,
        event_window="1h",
        stale_after="2m",
        slo_target=0.995,
        severity={"CheckpointSaveAborted": "info"},
        for_={"CheckpointTooOld": "90s"},
    )
    assert type(config.drain_margin) is int
    expr = {
        r["alert"]: r
        for g in rules.rule_groups(config)["groups"]
        for r in g["rules"]
        if "alert" in r
    }
    assert "> 2 * " in expr["CheckpointDrainFallingBehind"]["expr"]
    assert expr["CheckpointTooOld"]["for"] == "90s"


def test_rules_and_dashboards_write_only_where_they_are_told(tmp_path: Path) -> None:
    cwd, out = tmp_path / "cwd", tmp_path / "out"
    cwd.mkdir()
    for verb in ("rules", "dashboards"):
        result = run_cli(verb, "--output-dir", str(out / verb), cwd=cwd)
        assert result.returncode == 0, result.stderr
    assert list(cwd.iterdir()) == []  # no deploy/kubernetes/ beside them
    assert [p.name for p in (out / "rules").iterdir()] == ["checkpoint-exporter.rules.yaml"]
    boards = sorted(p.name for p in (out / "dashboards").iterdir())
    assert boards == sorted(f"{uid}.json" for uid in dashboards.DASHBOARDS)
    # The manifests, each with its generator, only when asked for.
    for verb, manifest in (("rules", "prometheusrule.yaml"), ("dashboards", "dashboards.yaml")):
        k8s = out / f"{verb}-k8s"
        result = run_cli(
            verb, "--output-dir", str(out / verb), "--kubernetes-dir", str(k8s), cwd=cwd
        )
        assert result.returncode == 0, result.stderr
        assert [p.name for p in k8s.iterdir()] == [manifest]
    assert list(cwd.iterdir()) == []


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


# --- pages that are right in week one ([pager]) --------------------------------------------


def test_a_jobs_critical_alerts_page_only_while_it_runs_with_stated_objectives() -> None:
    """Each critical per-job alert is two rules: the page, for a job that runs and whose
    objectives were stated; the same condition as a ticket for every other job."""
    found = all_rules()
    for name in rules.PAGING_ALERTS:
        page, ticket = found[name]
        assert page["labels"]["severity"] == "critical", name
        assert page["expr"].endswith(f"\nand on (cluster, training_job) {rules.PAGES}\n"), name
        assert ticket["labels"]["severity"] == "warning", name
        assert ticket["expr"].endswith(f"\nunless on (cluster, training_job) {rules.PAGES}\n")
        assert page["expr"].partition(")\n")[0] == ticket["expr"].partition(")\n")[0], name
    # What pages at all: a failure that loses (or is about to lose) the state a job restarts
    # from, or the monitoring of it. One exporter, one drill, one slow save: tickets.
    pages = {name for name, (severity, _, _) in ALERTS.items() if severity == "critical"}
    assert pages == rules.PAGING_ALERTS | {
        "CheckpointDrainLostGeneration", "CheckpointJobUnmonitored",
        "CheckpointShardUnmonitored", "CheckpointDeadlineBudgetBurn",
    }  # fmt: skip
    for name in ("TooOld", "NeverCommitted", "SaveHung"):  # never for a job that does not run
        assert (
            f"and on (cluster, training_job) {rules.ACTIVE}"
            in found[f"Checkpoint{name}"][0]["expr"]
        )


def test_a_severity_override_to_warning_leaves_one_rule(tmp_path: Path) -> None:
    c = MixinConfig(severity={"CheckpointTooOld": "warning"})
    generated = [
        r for g in rules.rule_groups(c)["groups"] for r in g["rules"]
        if r.get("alert") == "CheckpointTooOld"
    ]  # fmt: skip
    assert len(generated) == 1 and generated[0]["labels"]["severity"] == "warning"
    assert rules.PAGES not in generated[0]["expr"]


def _too_old_where_the_scheduler_says(
    tmp_path: Path, mixin_text: str, scheduler: list[dict], cluster: str | None = None
) -> subprocess.CompletedProcess:
    """promtool on two jobs whose newest checkpoint is 90 minutes old: "ended" still shows life
    (a write a minute ago), "quiet" none for over abandon_after. Passes when CheckpointTooOld
    pages for "quiet" alone: the scheduler's series (``scheduler``) name it running, not
    "ended"."""
    mixin = write_config(tmp_path, mixin_text + "rule_layout: split\n", "m.yaml")
    out = tmp_path / "rules"
    result = run_cli("rules", "--config.file", str(mixin), "--output-dir", str(out))
    assert result.returncode == 0, result.stderr
    exporter = 'job="checkpoint-exporter",instance="n1"'
    if cluster:
        exporter += f',cluster="{cluster}"'
    series = []
    for job, alive in (("ended", "0+60x100"), ("quiet", "0x100")):
        labels = f'{exporter},training_job="{job}"'
        series += [
            {
                "series": f"checkpoint_last_committed_timestamp_seconds{{{labels}}}",
                "values": "0x100",
            },
            {"series": f"checkpoint_interval_seconds{{{labels}}}", "values": "600x100"},
            {"series": f"checkpoint_deadline_seconds{{{labels}}}", "values": "60x100"},
            {
                "series": f"checkpoint_job_first_seen_timestamp_seconds{{{labels}}}",
                "values": "0x100",
            },
            {"series": f"checkpoint_job_alive_timestamp_seconds{{{labels}}}", "values": alive},
            {"series": f"checkpoint_job_finished{{{labels}}}", "values": "0x100"},
            {"series": f"checkpoint_job_abandon_after_seconds{{{labels}}}", "values": "1800x100"},
            {"series": f"checkpoint_job_paging{{{labels}}}", "values": "1x100"},
        ]
    expected = {"severity": "critical", "training_job": "quiet"}
    if cluster:
        expected["cluster"] = cluster
    tests = {
        "rule_files": [str(out / "checkpoint-exporter-job.rules.yaml")],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": series + scheduler,
            "alert_rule_test": [{
                "eval_time": "90m", "alertname": "CheckpointTooOld",
                "exp_alerts": [{
                    "exp_labels": expected,
                    "exp_annotations": {
                        "summary": ALERTS["CheckpointTooOld"][2],
                        "description": "quiet: the newest committed checkpoint is 1h 30m 0s old, "
                        "more than its interval plus deadline, and the job runs (not finished, "
                        "and its scheduler says it runs). A restart now would lose that much "
                        "training.",
                        "runbook_url": MixinConfig().runbook("CheckpointTooOld"),
                    },
                }],
            }],
        }],
    }  # fmt: skip
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(tests))
    return subprocess.run(
        [require_tool("promtool"), "test", "rules", str(tmp_path / "t.yaml")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip


def test_a_schedulers_view_of_running_jobs_decides_what_pages(tmp_path: Path) -> None:
    """job_running joins a scheduler's metric (here kube-state-metrics' pod phase, relabelled to
    the training job's name): a job it does not name stops paging at once, however recent its
    own signs of life (the uninstrumented job that finished an hour ago); a job it names pages
    even when its own signs are older than abandon_after."""
    running = (
        'max by (cluster, training_job) (label_replace(kube_pod_status_phase{phase="Running"} == 1,'
        ' "training_job", "$1", "pod", "(.+)-launcher"))'
    )
    scheduler = [
        {"series": 'kube_pod_status_phase{pod="quiet-launcher",phase="Running"}', "values": "1x100"}
    ]
    tested = _too_old_where_the_scheduler_says(tmp_path, f"job_running: '{running}'\n", scheduler)
    assert tested.returncode == 0, tested.stdout + tested.stderr


# What each of the README's job_running examples reads: the scheduler names "quiet" running and
# not "ended" (its pod completed, its Slurm job too).
SCHEDULERS = {
    "kube_pod_labels": [
        {"series": f'kube_pod_labels{{cluster="c1",namespace="ml",pod="{job}-0",'
                   f'label_training_job="{job}"}}', "values": "1x100"}
        for job in ("quiet", "ended")
    ] + [
        {"series": f'kube_pod_status_phase{{cluster="c1",namespace="ml",pod="{job}-0",'
                   f'phase="{phase}"}}', "values": f"{value}x100"}
        for job, phase, value in (
            ("quiet", "Running", 1), ("ended", "Running", 0), ("ended", "Succeeded", 1),
        )
    ],
    "slurm_job_info": [
        {"series": f'slurm_job_info{{cluster="c1",job_id="{n}",job_name="{job}",'
                   f'job_state="{state}"}}', "values": "1x100"}
        for n, job, state in ((1, "quiet", "RUNNING"), (2, "ended", "COMPLETED"))
    ],
}  # fmt: skip


def readme_job_running_examples() -> dict[str, str]:
    """docs/alerts.md's job_running examples (mixin configs), by the metric each reads."""
    guide = (REPO / "docs" / "alerts.md").read_text()
    blocks = re.findall(r"```yaml\n(job_running:.*?)```", guide, re.S)
    return {next(m for m in SCHEDULERS if m in block): block for block in blocks}


def test_the_readmes_job_running_examples_page_for_the_jobs_the_scheduler_runs(
    tmp_path: Path,
) -> None:
    examples = readme_job_running_examples()
    assert set(examples) == set(SCHEDULERS)
    for metric, block in examples.items():
        (tmp_path / metric).mkdir()
        load_mixin(str(write_config(tmp_path / metric, block, "check.yaml")))  # valid as is
        tested = _too_old_where_the_scheduler_says(
            tmp_path / metric, block, SCHEDULERS[metric], cluster="c1"
        )
        assert tested.returncode == 0, metric + tested.stdout + tested.stderr


def test_burn_min_misses_is_a_mixin_setting(tmp_path: Path) -> None:
    c = load_mixin(str(write_config(tmp_path, "burn_min_misses: 5\n", "m.yaml")))
    fast = next(
        r for g in rules.rule_groups(c)["groups"] for r in g["rules"]
        if r.get("alert") == "CheckpointDeadlineBudgetBurn"
    )  # fmt: skip
    assert "[6h])) >= 5\n" in fast["expr"]
    with pytest.raises(ConfigError, match="burn_min_misses"):
        load_mixin(str(write_config(tmp_path, "burn_min_misses: 0\n", "bad.yaml")))


def test_the_readme_alert_table_matches_the_severities() -> None:
    """README's "pages | tickets" table lists every alert once, under ALERTS' severity."""
    readme = (REPO / "README.md").read_text()
    section = readme.partition("\n## Alerts\n")[2]
    table = section.partition("| pages (critical) | tickets (warning) |\n|---|---|\n")[2]
    row = table.partition("\n")[0]
    cells = [cell.strip() for cell in row.strip().strip("|").split("|")]
    assert len(cells) == 2, row
    pages, tickets = (cell.split(", ") for cell in cells)
    assert len(pages) == len(set(pages)) and len(tickets) == len(set(tickets))
    severity = {name: alert[0] for name, alert in ALERTS.items()}
    assert set(pages) == {name for name, level in severity.items() if level == "critical"}
    assert set(tickets) == {name for name, level in severity.items() if level == "warning"}


def test_incomplete_upload_max_age_is_a_mixin_setting(tmp_path: Path) -> None:
    """The open uploads' age threshold and the description's words follow the mixin config, in
    both rules (the bytes where the store tells them, the count where it does not)."""
    c = load_mixin(str(write_config(tmp_path, "incomplete_upload_max_age: 8d\n", "m.yaml")))
    piling = [
        r for g in rules.rule_groups(c)["groups"] for r in g["rules"]
        if r.get("alert") == "CheckpointIncompleteUploadsPiling"
    ]  # fmt: skip
    assert len(piling) == 2
    for rule in piling:
        assert "_oldest_incomplete_upload_timestamp_seconds" in rule["expr"]
        assert f"> {8 * 86400})\n" in rule["expr"]
        assert "not grown for over 8d" in rule["annotations"]["description"]
    assert "humanize1024" in piling[0]["annotations"]["description"]
    assert "does not tell their size" in piling[1]["annotations"]["description"]
    with pytest.raises(ConfigError, match="incomplete_upload_max_age"):
        load_mixin(str(write_config(tmp_path, "incomplete_upload_max_age: 2\n", "bad.yaml")))
