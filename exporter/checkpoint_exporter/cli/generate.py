"""What ``rules`` and ``dashboards`` share: both write the mixin's generated files."""

from __future__ import annotations

import argparse
from pathlib import Path

from checkpoint_exporter.cli.common import EXIT_OK, report_config_error


def add_arguments(parser: argparse.ArgumentParser, verb: str, default: str) -> None:
    """``verb``'s flags; ``default``: its output directory when --output-dir is not given."""
    parser.add_argument(
        "--config.file",
        dest="config_file",
        metavar="FILE",
        help="mixin config (YAML): selector, severities, `for` durations, runbook URL, SLO",
    )
    parser.add_argument(
        "--output-dir", default=default, metavar="DIR", help=f"(default: ./{default})"
    )
    manifest = "PrometheusRule" if verb == "rules" else "dashboards ConfigMap"
    parser.add_argument(
        "--kubernetes-dir",
        metavar="DIR",
        help=f"also write the {manifest} manifest here (default: not written)",
    )


def run(args: argparse.Namespace) -> int:
    from checkpoint_exporter.config import ConfigError
    from checkpoint_exporter.mixin.config import load_mixin
    from checkpoint_exporter.mixin.generate import write_outputs

    try:
        mixin = load_mixin(args.config_file)
    except ConfigError as error:
        return report_config_error(error)
    targets = {args.verb: Path(args.output_dir)}
    if args.kubernetes_dir:
        manifest = "prometheusrule" if args.verb == "rules" else "dashboards-configmap"
        targets[manifest] = Path(args.kubernetes_dir)
    for path in write_outputs(mixin, targets):
        print(f"wrote {path}")
    return EXIT_OK
