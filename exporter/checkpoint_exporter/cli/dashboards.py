"""``dashboards``: generate the Grafana dashboards (and a dashboards ConfigMap)."""

from __future__ import annotations

import argparse

from checkpoint_exporter.cli import generate

HELP = "generate the Grafana dashboards"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    generate.add_arguments(parser, "dashboards", default="dashboards")


def run(args: argparse.Namespace) -> int:
    return generate.run(args)
