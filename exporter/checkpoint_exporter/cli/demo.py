"""``demo``: a small simulated cluster on this machine, watched by the real exporter."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "a small simulated cluster on this machine, watched by the real exporter"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workdir", metavar="DIR", help="keep its files here (default: temporary)")
    parser.add_argument("--duration", type=float, metavar="SECONDS", help="stop after this long")
    parser.add_argument(
        "--port",
        type=int,
        default=25780,
        help="the exporter's; Prometheus +10, Alertmanager +11, node_exporter +12",
    )


def run(args: argparse.Namespace) -> int:
    from checkpoint_exporter.demo.cluster import run

    return run(Path(args.workdir) if args.workdir else None, args.duration, args.port)
