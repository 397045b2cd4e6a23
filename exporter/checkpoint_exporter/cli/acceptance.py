"""``acceptance``: a storage system's deployment acceptance checklist, judged from a Prometheus
over a time range (acceptance/)."""

from __future__ import annotations

import argparse

from checkpoint_exporter import logs

HELP = (
    "judge a storage system's deployment acceptance checklist (known checkpoint, "
    "concurrent burst, repeatability, interrupted save, recovery drill, handover) from a "
    "Prometheus over a time range: HTML, JSON and Markdown report; exit 1 when a "
    "measured row fails"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--prometheus.url",
        dest="prometheus_url",
        required=True,
        metavar="URL",
        help="the Prometheus (or Thanos / Mimir query) that scraped the exporters",
    )
    parser.add_argument(
        "--from", dest="start", metavar="T", help="start: unix seconds, RFC 3339, now or now-30m"
    )
    parser.add_argument("--to", dest="end", metavar="T", help="end (default: now)")
    parser.add_argument(
        "--range",
        dest="span",
        metavar="DURATION",
        help="length of the range, e.g. 10m (default 1h, or --from to now)",
    )
    parser.add_argument(
        "--config.file",
        dest="config_file",
        metavar="FILE",
        help="the exporter config: per-job objectives (a job it names keeps its own entry)",
    )
    parser.add_argument(
        "--objectives",
        dest="objectives_file",
        metavar="FILE",
        help="the agreed objectives: the output of `plan --emit-objectives` (for the jobs "
        "--config.file does not name)",
    )
    parser.add_argument(
        "--parameters",
        metavar="N",
        help="the model's parameter count (70e9, 70B): compare the measured checkpoint size "
        "with N x bytes-per-parameter",
    )
    parser.add_argument(
        "--bytes-per-parameter",
        dest="bytes_per_parameter",
        type=float,
        default=14.0,
        metavar="B",
        help="the plan's assumption (default 14)",
    )
    parser.add_argument(
        "--size-tolerance",
        dest="size_tolerance",
        type=float,
        default=0.12,
        metavar="F",
        help="allowed size deviation from the plan, a fraction (default 0.12)",
    )
    parser.add_argument(
        "--output",
        default="acceptance",
        metavar="DIR",
        help="where acceptance.html, .json and .md go (default ./acceptance)",
    )
    parser.add_argument(
        "--job",
        dest="jobs",
        action="append",
        default=[],
        metavar="NAME",
        help="judge only this training job (repeatable; default: every job seen)",
    )
    parser.add_argument(
        "--selector",
        default='job="checkpoint-exporter"',
        metavar="MATCHERS",
        help="PromQL matchers finding the exporters' series, as the mixin's "
        '(default: job="checkpoint-exporter")',
    )
    parser.add_argument("--log.level", dest="log_level", choices=logs.LEVELS, default="info")


def run(args: argparse.Namespace) -> int:
    from checkpoint_exporter.acceptance.run import Request, run

    return run(
        Request(
            prometheus_url=args.prometheus_url,
            start=args.start,
            end=args.end,
            span=args.span,
            config_file=args.config_file,
            objectives_file=args.objectives_file,
            parameters=args.parameters,
            bytes_per_parameter=args.bytes_per_parameter,
            size_tolerance=args.size_tolerance,
            output=args.output,
            jobs=tuple(args.jobs),
            selector=args.selector,
        )
    )
