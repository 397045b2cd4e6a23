"""``rules``: generate the alert and recording rules (and a PrometheusRule)."""

from __future__ import annotations

import argparse

from checkpoint_exporter.cli import generate

HELP = "generate the alert and recording rules (and a PrometheusRule)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    generate.add_arguments(parser, "rules", default="alerts")


def run(args: argparse.Namespace) -> int:
    return generate.run(args)
