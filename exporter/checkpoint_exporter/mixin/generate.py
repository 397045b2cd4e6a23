"""``make generate``: rebuild every committed generated file from the code that defines it.

``--check`` rebuilds in memory and exits 1 naming each file that differs, so CI can prove the
committed copies are current.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Callable
from pathlib import Path

from checkpoint_exporter.exposition import metrics
from checkpoint_exporter.mixin import dashboards, rules
from checkpoint_exporter.mixin.config import SINGLE, SPLIT, MixinConfig

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


def outputs(mixin: MixinConfig) -> dict[str, dict[str, str]]:
    """What each generator writes: kind -> {file name: content}."""
    boards = {f"{uid}.json": dashboards.dashboard_json(uid, mixin) for uid in dashboards.DASHBOARDS}
    return {
        "rules": {name: rules.to_yaml(doc) for name, doc in rules.rule_files(mixin).items()},
        "prometheusrule": {
            name: rules.to_yaml(doc) for name, doc in rules.prometheus_rules(mixin).items()
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


# Where each layout's outputs are committed (kind -> directory). Both rule layouts are: the
# single file for one Prometheus, the split files (in their own directory, so that a glob over
# alerts/*.yaml never loads a rule twice) for a sharded Prometheus with a global ruler, and the
# split PrometheusRules as a kustomize component that replaces the single one.
_WHERE = {
    SINGLE: {
        "rules": "alerts",
        "prometheusrule": "deploy/kubernetes/base",
        "dashboards": "dashboards",
        "dashboards-configmap": "deploy/kubernetes/base",
    },
    SPLIT: {"rules": "alerts/split", "prometheusrule": "deploy/kubernetes/components/split-rules"},
}


def _committed() -> dict[str, Callable[[Path], str]]:
    """Each generated file, relative to the repository root, and how to build it."""
    targets: dict[str, Callable[[Path], str]] = {
        "docs/metrics.md": _metrics_doc,
        # The exporter serves its runbooks at /runbooks, where the alerts' runbook_url points.
        "exporter/checkpoint_exporter/runbooks.md": _runbooks,
    }
    for layout, where in _WHERE.items():
        built = outputs(MixinConfig(rule_layout=layout))
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
