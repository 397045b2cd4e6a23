"""``check-config``: validate a config file and print it resolved, every default filled in."""

from __future__ import annotations

import argparse
import sys

from checkpoint_exporter.cli.common import EXIT_OK, add_common, report_config_error

HELP = "validate a config file and print it resolved"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common(parser, config_required=True)


def run(args: argparse.Namespace) -> int:
    import yaml

    from checkpoint_exporter.config import ConfigError, config_to_dict, load_config

    try:
        config = load_config(args.config_file)
    except ConfigError as error:
        return report_config_error(error)
    sys.stdout.write(yaml.safe_dump(config_to_dict(config), sort_keys=False))
    for note in config.warnings:
        print(f"warning: {note}", file=sys.stderr)
    print(
        f"{args.config_file}: ok ({len(config.jobs)} jobs, {len(config.discover)} discover roots)",
        file=sys.stderr,
    )
    return EXIT_OK
