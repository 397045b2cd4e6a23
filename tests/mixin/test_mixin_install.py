"""The mixin settings an install needs: runbook links a person can open, the labels the
Prometheus Operator selects by, and how the dashboards find a node's other exporters."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from checkpoint_exporter.config import ConfigError
from checkpoint_exporter.mixin import generate, rules
from checkpoint_exporter.mixin.config import (
    RUNBOOK_URL,
    SPLIT,
    MixinConfig,
    load_mixin,
    runbook_url_problem,
)
from tests.conftest import REPO, run_cli, write_config

IN_CLUSTER = "http://checkpoint-exporter-shared.monitoring.svc:25780/runbooks"


def test_the_default_runbook_links_open_outside_the_cluster() -> None:
    """https, a public name, the project's own docs/runbooks.md (GitHub ids each heading as
    the alert's name in lower case, which runbook() appends)."""
    assert runbook_url_problem(RUNBOOK_URL) is None
    assert RUNBOOK_URL.startswith("https://github.com/") and RUNBOOK_URL.endswith(
        "/blob/main/docs/runbooks.md"
    )
    assert MixinConfig().runbook("CheckpointTooOld") == f"{RUNBOOK_URL}#checkpointtooold"
    # The package's metadata (pyproject's [project.urls], where it has them) names the same
    # repository. (tomllib is Python 3.11+; the project supports 3.10.)
    home = re.search(r'^Homepage = "([^"]+)"', (REPO / "pyproject.toml").read_text(), re.M)
    if home:
        assert RUNBOOK_URL.startswith(home.group(1).rstrip("/") + "/")


@pytest.mark.parametrize(
    "url",
    [
        "http://checkpoint-exporter.monitoring.svc:25780/runbooks",  # the old default
        "http://checkpoint-exporter.monitoring.svc.cluster.local:25780/runbooks",
        "http://runbooks.cluster.local/checkpoint-exporter",
        "http://checkpoint-exporter:25780/runbooks",  # a search-domain name
        "http://localhost:25780/runbooks",
        "http://127.0.0.1:25780/runbooks",
        "http://[::1]:25780/runbooks",
    ],
)
def test_a_cluster_internal_base_is_refused_unless_opted_in(tmp_path: Path, url: str) -> None:
    mixin = write_config(tmp_path, f"# mixin\nrunbook_url: {url}\n", "mixin.yaml")
    with pytest.raises(ConfigError) as caught:
        load_mixin(str(mixin))
    (problem,) = caught.value.problems
    assert problem.key == "runbook_url" and problem.line == 2
    assert "runbook_url_internal: true" in problem.reason
    mixin.write_text(f"runbook_url: {url}\nrunbook_url_internal: true\n")
    assert load_mixin(str(mixin)).runbook_url == url


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("checkpoint-exporter.monitoring.svc/runbooks", "is not an http(s) URL"),
        ("file:///usr/share/doc/checkpoint-exporter/runbooks.md", "is not an http(s) URL"),
        ("https://wiki.example.com/runbooks#top", "has a query or fragment"),
    ],
)
def test_a_base_that_is_no_link_is_refused_even_opted_in(
    tmp_path: Path, url: str, reason: str
) -> None:
    mixin = write_config(tmp_path, f"runbook_url: '{url}'\nrunbook_url_internal: true\n", "m.yaml")
    with pytest.raises(ConfigError) as caught:
        load_mixin(str(mixin))
    (problem,) = caught.value.problems
    assert problem.key == "runbook_url" and reason in problem.reason


def test_the_generators_refuse_an_unusable_base(tmp_path: Path) -> None:
    """`checkpoint-exporter rules` names the file, line and key and writes nothing; a config
    built in code fails in the generator itself."""
    mixin = write_config(tmp_path, "runbook_url: http://runbooks.monitoring.svc/\n", "m.yaml")
    result = run_cli("rules", "--config.file", str(mixin), "--output-dir", str(tmp_path / "out"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"{mixin}:1: runbook_url: " in result.stderr
    assert not (tmp_path / "out").exists()
    with pytest.raises(ValueError, match="runbook_url: 'ftp://x/y' is not an http"):
        generate.outputs(MixinConfig(runbook_url="ftp://x/y"))
    internal = MixinConfig(runbook_url=IN_CLUSTER, runbook_url_internal=True)
    rule = rules.prometheus_rules(internal)["prometheusrule.yaml"]
    assert f"{IN_CLUSTER}#checkpointtooold" in rules.to_yaml(rule)
    assert generate.outputs(internal)["prometheusrule"]


def test_operator_labels_come_from_the_mixin_config(tmp_path: Path) -> None:
    mixin = write_config(
        tmp_path,
        "rule_layout: split\nmonitor_labels: {release: kps}\nrule_labels: {release: kps}\n"
        "job_rule_labels: {ruler: thanos}\n",
        "mixin.yaml",
    )
    config = load_mixin(str(mixin))
    built = generate.outputs(config)
    for name in ("servicemonitor.yaml", "podmonitor.yaml"):
        assert "release: kps" in built["monitors"][name]
    assert "release: kps" in built["scanner-monitors"]["servicemonitor.yaml"]
    objects = rules.prometheus_rules(config)
    node = objects["prometheusrule-node.yaml"]["metadata"]["labels"]
    job = objects["prometheusrule-job.yaml"]["metadata"]["labels"]
    assert node["release"] == "kps" and "release" not in job and job["ruler"] == "thanos"
    assert (node["checkpoint-exporter/rules"], job["checkpoint-exporter/rules"]) == ("node", "job")
    # Unset, the per-job rules take rule_labels: a default install's one Prometheus loads both.
    plain = rules.prometheus_rules(MixinConfig(rule_layout=SPLIT, rule_labels={"a": "b"}))
    assert plain["prometheusrule-job.yaml"]["metadata"]["labels"]["a"] == "b"


@pytest.mark.parametrize(
    ("setting", "reason"),
    [
        ("monitor_labels: [release]", "monitor_labels: expected a mapping of label to value"),
        ("rule_labels: {release: 1}", "rule_labels: release: 1 is not a Kubernetes label value"),
        ("rule_labels: {'bad key!': x}", "rule_labels: 'bad key!' is not a Kubernetes label key"),
        ("exporter_node_labels: [node, 2x]", "exporter_node_labels: '2x' is not a Prometheus"),
        ("node_exporter_node_regex: '(unclosed'", "node_exporter_node_regex: invalid regular"),
        ("network_device_exclude: '['", "network_device_exclude: invalid regular expression"),
        (
            "node_label: instance\nnode_exporter_node_label: nodename",
            "node_label: set either node_label",
        ),
    ],
)
def test_bad_install_settings_are_named(tmp_path: Path, setting: str, reason: str) -> None:
    mixin = write_config(tmp_path, setting + "\n", "mixin.yaml")
    with pytest.raises(ConfigError) as caught:
        load_mixin(str(mixin))
    (problem,) = (str(p) for p in caught.value.problems)
    assert reason in problem, problem


def test_the_old_node_label_still_sets_both_sides(tmp_path: Path) -> None:
    """`node_label` (one label for the exporters and node_exporter) keeps its meaning."""
    config = load_mixin(str(write_config(tmp_path, "node_label: host\n", "mixin.yaml")))
    assert config.exporter_nodes() == (("host", config.node_regex),)
    assert config.node_exporter_node() == ("host", config.node_regex)
    default = MixinConfig()
    assert [label for label, _ in default.exporter_nodes()] == ["node", "instance"]
    assert default.node_exporter_node() == ("instance", default.node_regex)
    one = load_mixin(str(write_config(tmp_path, "exporter_node_labels: node\n", "one.yaml")))
    assert one.exporter_node_labels == ("node",)
