"""The ``checkpoint-exporter`` command: serve (default) | check-config | plan | restore-drill |
rules | dashboards | demo | acceptance | healthcheck.

One module per verb, each with its flags (``add_arguments``) and what it does (``run``); this
one assembles them and picks the verb (none given: serve).

Exit status: 0 ok, 2 usage or configuration error, 1 runtime failure.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from types import ModuleType

from checkpoint_exporter import __version__, logs
from checkpoint_exporter.cli import (
    acceptance,
    check_config,
    dashboards,
    demo,
    healthcheck,
    plan,
    restore_drill,
    rules,
    serve,
)
from checkpoint_exporter.cli.common import EXIT_FAILURE, EXIT_OK, EXIT_USAGE

__all__ = ["EXIT_FAILURE", "EXIT_OK", "EXIT_USAGE", "VERBS", "build_parser", "main"]

# In the order --help lists them.
VERB_MODULES: dict[str, ModuleType] = {
    "serve": serve,
    "check-config": check_config,
    "plan": plan,
    "restore-drill": restore_drill,
    "demo": demo,
    "acceptance": acceptance,
    "rules": rules,
    "dashboards": dashboards,
    "healthcheck": healthcheck,
}
VERBS = tuple(VERB_MODULES)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="checkpoint-exporter",
        description="Prometheus exporter for GPU training checkpoints. "
        "Without a verb, runs `serve`.",
    )
    parser.add_argument("--version", action="version", version=f"checkpoint-exporter {__version__}")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB")
    for verb, module in VERB_MODULES.items():
        module.add_arguments(
            verbs.add_parser(
                verb, help=module.HELP, description=getattr(module, "DESCRIPTION", None)
            )
        )
    return parser


def _with_default_verb(argv: Sequence[str]) -> list[str]:
    argv = list(argv)
    if argv and (argv[0] in VERBS or argv[0] in ("-h", "--help", "--version")):
        return argv
    return ["serve", *argv]


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(_with_default_verb(sys.argv[1:] if argv is None else argv))
    logs.setup(getattr(args, "log_level", "info"), getattr(args, "log_format", "logfmt"))
    try:
        return VERB_MODULES[args.verb].run(args)
    except KeyboardInterrupt:
        return EXIT_FAILURE
