"""What the verbs share: the exit statuses, the flags every config-reading verb takes, and how a
configuration's problems are reported."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from checkpoint_exporter import logs

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2

# The logger the CLI has always logged under (logs.py prints its name, less this prefix).
log = logging.getLogger("checkpoint_exporter")


def add_common(parser: argparse.ArgumentParser, config_required: bool = False) -> None:
    parser.add_argument(
        "--config.file",
        dest="config_file",
        metavar="FILE",
        required=config_required,
        help="exporter configuration (YAML)",
    )
    parser.add_argument("--log.level", dest="log_level", choices=logs.LEVELS, default="info")
    parser.add_argument("--log.format", dest="log_format", choices=logs.FORMATS, default="logfmt")


def refuse_unknown_flags(parser: argparse.ArgumentParser) -> None:
    """argparse hands a verb's unknown flags up to the top-level parser, whose usage lists the
    verbs and none of this verb's flags: refuse them here, with the verb's usage (exit 2) and
    the nearest flag it has."""
    import difflib

    parse_known_args = parser.parse_known_args
    flags = [flag for action in parser._actions for flag in action.option_strings]

    def parse_known_args_strictly(
        args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        namespace, extras = parse_known_args(args, namespace)
        if extras:
            hints = [
                f"{near[0]} for {extra}"
                for extra in extras
                if extra.startswith("-")
                and (near := difflib.get_close_matches(extra.split("=")[0], flags, n=1))
            ]
            hint = f"; did you mean {', '.join(hints)}?" if hints else ""
            parser.error(f"unrecognized arguments: {' '.join(extras)}{hint}")
        return namespace, extras

    parser.parse_known_args = parse_known_args_strictly  # type: ignore[method-assign]


def report_config_error(error: Exception) -> int:
    problems = getattr(error, "problems", [])
    noun = "problem" if len(problems) == 1 else "problems"
    print(f"configuration has {len(problems)} {noun}:", file=sys.stderr)
    for problem in problems:
        print(f"  {problem}", file=sys.stderr)
    return EXIT_USAGE
