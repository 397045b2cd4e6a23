"""``make generate``: rebuild every committed generated file from the code that defines it:
docs/metrics.md, the rules, dashboards and manifests, the packaged runbooks, and the golden
scrapes in tests/exposition/golden/.

``--check`` rebuilds in memory and exits 1 naming each file that differs, so CI can prove the
committed copies are current.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from checkpoint_exporter.exposition import golden, metrics
from checkpoint_exporter.mixin import dashboards, rules
from checkpoint_exporter.mixin.config import SPLIT, MixinConfig, check_mixin

BEGIN = "<!-- BEGIN GENERATED: {name} (make generate) -->"
END = "<!-- END GENERATED: {name} -->"


def _replace_block(text: str, name: str, body: str, file: Path) -> str:
    """Swap the generated block ``name`` inside a hand-written Markdown file."""
    begin, end = BEGIN.format(name=name), END.format(name=name)
    if begin not in text or end not in text:
        raise ValueError(f"{file}: markers for the generated block {name!r} are missing")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{body}{end}{tail}"


def _recorded_expr(record: str) -> str:
    for group in rules.rule_groups()["groups"]:
        for rule in group["rules"]:
            if rule.get("record") == record:
                return rule["expr"].rstrip("\n") + "\n"
    raise KeyError(record)


def _metrics_doc(root: Path) -> str:
    path = root / "docs" / "metrics.md"
    text = _replace_block(path.read_text(), "metrics", metrics.reference_table(), path)
    for name, record in (
        ("promql generations_that_fit", rules.GENERATIONS_THAT_FIT),
        ("promql peak_footprint_ratio", rules.PEAK_FOOTPRINT),
    ):
        block = f"```promql\n{_recorded_expr(record)}```\n"
        text = _replace_block(text, name, block, path)
    return text


def _runbooks(root: Path) -> str:
    return (root / "docs" / "runbooks.md").read_text()


def _dashboards_configmap(files: dict[str, str]) -> str:
    """The dashboards as a ConfigMap that Grafana's dashboard sidecar picks up."""
    manifest = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "checkpoint-exporter-dashboards",
            "labels": {"app.kubernetes.io/name": "checkpoint-exporter", "grafana_dashboard": "1"},
        },
        "data": files,
    }
    return rules.to_yaml(manifest)


_NAME = {"app.kubernetes.io/name": "checkpoint-exporter"}


def _monitor(kind: str, name: str, component: str, labels: dict[str, str]) -> dict[str, Any]:
    """A ServiceMonitor of one component's Service, or a PodMonitor of its pods, labelled for
    the Prometheus resource's serviceMonitorSelector / podMonitorSelector (monitor_labels).
    Every 15 s, the job label the Service's (pods') app.kubernetes.io/name, which the rules'
    selector finds, and the node the pod runs on as `node`: the first of the mixin's
    exporter_node_labels, so the dashboards meet node_exporter and dcgm-exporter by node."""
    endpoint: dict[str, Any] = {"port": "metrics", "path": "/metrics", "interval": "15s"}
    if kind == "ServiceMonitor":
        endpoint["scrapeTimeout"] = "10s"
    endpoint["relabelings"] = [
        {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"}
    ]
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": kind,
        "metadata": {"name": name, "labels": {**_NAME, **labels}},
        "spec": {
            "jobLabel": "app.kubernetes.io/name",
            "selector": {"matchLabels": {**_NAME, "app.kubernetes.io/component": component}},
            ("endpoints" if kind == "ServiceMonitor" else "podMetricsEndpoints"): [endpoint],
        },
    }


def monitors(mixin: MixinConfig) -> dict[str, dict[str, Any]]:
    """The DaemonSet's monitors, by file name: a ServiceMonitor, or the PodMonitor instead of
    it and its Service."""
    labels = mixin.monitor_labels
    return {
        "servicemonitor.yaml": _monitor(
            "ServiceMonitor", "checkpoint-exporter", "exporter", labels
        ),
        "podmonitor.yaml": _monitor("PodMonitor", "checkpoint-exporter", "exporter", labels),
    }


def scanner_monitors(mixin: MixinConfig) -> dict[str, dict[str, Any]]:
    """The shared scanners' ServiceMonitor (the cluster shape's component)."""
    return {
        "servicemonitor.yaml": _monitor(
            "ServiceMonitor", "checkpoint-exporter-shared", "shared-scanner", mixin.monitor_labels
        )
    }


def outputs(mixin: MixinConfig) -> dict[str, dict[str, str]]:
    """What each generator writes: kind -> {file name: content}. A config that would write
    unusable rules (check_mixin) raises ValueError naming its key."""
    check_mixin(mixin)
    boards = {f"{uid}.json": dashboards.dashboard_json(uid, mixin) for uid in dashboards.DASHBOARDS}
    return {
        "rules": {name: rules.to_yaml(doc) for name, doc in rules.rule_files(mixin).items()},
        "prometheusrule": {
            name: rules.to_yaml(doc) for name, doc in rules.prometheus_rules(mixin).items()
        },
        "monitors": {name: rules.to_yaml(doc) for name, doc in monitors(mixin).items()},
        "scanner-monitors": {
            name: rules.to_yaml(doc) for name, doc in scanner_monitors(mixin).items()
        },
        "dashboards": boards,
        "dashboards-configmap": {"dashboards.yaml": _dashboards_configmap(boards)},
    }


def write_outputs(mixin: MixinConfig, targets: dict[str, Path]) -> list[Path]:
    """Write the outputs of each kind in ``targets`` (kind -> directory)."""
    written = []
    built = outputs(mixin)
    for kind, directory in targets.items():
        directory.mkdir(parents=True, exist_ok=True)
        for name, content in built[kind].items():
            (directory / name).write_text(content)
            written.append(directory / name)
    return written


# The committed variants (name -> config) and where each one's outputs go (kind -> directory).
# Both rule layouts are committed: the single file for one Prometheus, the split files (in
# their own directory, so that a glob over alerts/*.yaml never loads a rule twice) for a sharded
# Prometheus with a global ruler, and the split PrometheusRules as a kustomize component that
# replaces the single one. The Kubernetes dashboards differ from dashboards/ in one setting:
# dcgm-exporter runs on the pod network there (gpu-operator), so its node is its Hostname (the
# node name), where on a host it is its instance's host, as the exporters'.
KUBERNETES = MixinConfig(dcgm_node_label="Hostname")
_WHERE: dict[str, tuple[MixinConfig, dict[str, str]]] = {
    "single": (MixinConfig(), {"rules": "alerts", "dashboards": "dashboards"}),
    "split": (MixinConfig(rule_layout=SPLIT), {"rules": "alerts/split"}),
    "kubernetes": (KUBERNETES, {
        "prometheusrule": "deploy/kubernetes/base",
        "monitors": "deploy/kubernetes/base",
        "dashboards-configmap": "deploy/kubernetes/base",
    }),
    "kubernetes-split": (replace(KUBERNETES, rule_layout=SPLIT), {
        "prometheusrule": "deploy/kubernetes/components/split-rules",
        "scanner-monitors": "deploy/kubernetes/components/shared-scanners",
    }),
}  # fmt: skip


def _committed() -> dict[str, Callable[[Path], str]]:
    """Each generated file, relative to the repository root, and how to build it."""
    targets: dict[str, Callable[[Path], str]] = {
        "docs/metrics.md": _metrics_doc,
        # The exporter serves its runbooks at /runbooks (for a runbook_url inside the cluster).
        "exporter/checkpoint_exporter/runbooks.md": _runbooks,
    }
    # The golden scrapes of the reference snapshot (exposition/golden.py), in each format, which
    # tests/exposition/test_golden.py diffs against a fresh render.
    for relative, content in golden.files().items():
        targets[relative] = lambda _root, content=content: content
    for config, where in _WHERE.values():
        built = outputs(config)
        for kind, directory in where.items():
            for name, content in built[kind].items():
                targets[f"{directory}/{name}"] = lambda _root, content=content: content
    return targets


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m checkpoint_exporter.mixin.generate")
    parser.add_argument("--root", type=Path, default=Path.cwd(), help="repository root")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if stale")
    args = parser.parse_args(argv)
    stale = 0
    for relative, build in _committed().items():
        path = args.root / relative
        new = build(args.root)
        old = path.read_text() if path.exists() else ""
        if new == old:
            continue
        if args.check:
            stale += 1
            sys.stdout.writelines(
                difflib.unified_diff(
                    old.splitlines(True),
                    new.splitlines(True),
                    f"{relative} (committed)",
                    f"{relative} (generated)",
                )
            )
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(new)
            print(f"wrote {relative}")
    if stale:
        print(
            f"{stale} generated file(s) are stale: run `make generate` and commit", file=sys.stderr
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
