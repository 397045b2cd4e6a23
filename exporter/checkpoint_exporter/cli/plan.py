"""``plan``: the sizing worksheet, a model and a cluster turned into objectives."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from checkpoint_exporter.cli.common import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, refuse_unknown_flags

HELP = "sizing worksheet: model and cluster -> objectives"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from checkpoint_exporter.plan.worksheet import INPUT_FIELDS

    parser.add_argument("--config", metavar="FILE", help="YAML file of plan inputs (keys as below)")
    parser.add_argument(
        "--example",
        action="store_true",
        help="start from a worked example: four 70B-parameter jobs on 32 servers, a 60 s "
        "deadline every 15 minutes",
    )
    parser.add_argument("--format", choices=("table", "json", "yaml"), default="table")
    parser.add_argument(
        "--emit-objectives",
        action="store_true",
        help="print a defaults: block (interval, deadline, and mtbf when known) for the "
        "exporter config",
    )
    parser.add_argument(
        "--measured",
        metavar="PROMETHEUS_URL",
        help="also print what this Prometheus measured for --job (size, save time, per-server "
        "bytes, objectives) beside the planned values; the job's interval, deadline and mtbf "
        "fill the inputs not given",
    )
    parser.add_argument("--job", metavar="NAME", help="the training_job --measured reads")
    inputs = parser.add_argument_group("inputs (override --config and --example)")
    for name, spec in INPUT_FIELDS.items():
        meta = spec.metadata
        if meta["required"]:
            default = "required"
        elif meta["otherwise"] or spec.default is None:
            default = meta["otherwise"] or "optional"
        else:
            default = f"default {spec.default:g}"
        unit = f" [{meta['unit']}]" if meta["unit"] else ""
        inputs.add_argument(
            "--" + name.replace("_", "-"),
            dest=name,
            metavar="N",
            help=f"{meta['help']}{unit} ({default})",
        )
    refuse_unknown_flags(parser)


def run(args: argparse.Namespace) -> int:
    import yaml

    from checkpoint_exporter.config import read_yaml
    from checkpoint_exporter.plan.measured import format_comparison, planned_defaults
    from checkpoint_exporter.plan.measured import to_dict as measured_dict
    from checkpoint_exporter.plan.worksheet import (
        INPUT_FIELDS,
        WORKED_EXAMPLE,
        PlanInputError,
        compute,
        format_table,
        objectives_yaml,
        overlay,
        parse_inputs,
    )

    raw: dict[str, object] = dict(WORKED_EXAMPLE) if args.example else {}
    sources = {name: "--example" for name in raw}
    if args.config:
        try:
            text = Path(args.config).read_text(encoding="utf-8")
        except OSError as error:
            print(f"plan: {args.config}: {error.strerror}", file=sys.stderr)
            return EXIT_USAGE
        document = read_yaml(text, args.config)
        data = document.data
        if document.problems:
            for problem in document.problems:
                print(f"plan: {problem}", file=sys.stderr)
            return EXIT_USAGE
        if data is not None and not isinstance(data, dict):
            print(f"plan: {args.config}: expected a mapping of inputs", file=sys.stderr)
            return EXIT_USAGE
        raw = overlay(raw, data or {})
        sources.update({str(name): args.config for name in data or {}})
    flags = {name: getattr(args, name) for name in INPUT_FIELDS if getattr(args, name) is not None}
    raw = overlay(raw, flags)
    sources.update({name: "--" + name.replace("_", "-") for name in flags})
    measured = None
    if args.measured is not None or args.job is not None:
        measured = _plan_measured(args)
        if isinstance(measured, int):
            return measured
        defaults = planned_defaults(measured, raw)
        raw.update(defaults)
        sources.update({name: f"job {args.job} at {args.measured}" for name in defaults})
    try:
        result = compute(parse_inputs(raw))
    except PlanInputError as error:
        for name, reason in error.problems:
            origin = sources.get(name, "--" + name.replace("_", "-"))
            print(f"plan: {name} ({origin}): {reason}", file=sys.stderr)
        return EXIT_USAGE
    document = result.to_dict() if measured is None else measured_dict(result, measured)
    if args.emit_objectives:
        sys.stdout.write(objectives_yaml(result))
    elif args.format == "json":
        print(json.dumps(document, indent=2))
    elif args.format == "yaml":
        sys.stdout.write(yaml.safe_dump(document, sort_keys=False))
    else:
        sys.stdout.write(format_table(result))
        if measured is not None:
            sys.stdout.write(format_comparison(result, measured))
    return EXIT_OK


def _plan_measured(args: argparse.Namespace) -> Any:
    """What the Prometheus measured for the job, or the exit status when it cannot be had."""
    from checkpoint_exporter.plan.measured import MeasuredError, check_url, measure

    if args.measured is None or not args.job:
        print("plan: --measured PROMETHEUS_URL and --job NAME go together", file=sys.stderr)
        return EXIT_USAGE
    try:
        check_url(args.measured)
    except ValueError as error:
        print(f"plan: {error}", file=sys.stderr)
        return EXIT_USAGE
    try:
        return measure(args.measured, args.job)
    except MeasuredError as error:
        print(f"plan: {error}", file=sys.stderr)
        return EXIT_FAILURE
