"""``restore-drill``: restore the generation a restart would pick (restore.py)."""

from __future__ import annotations

import argparse

from checkpoint_exporter.cli.common import add_common, report_config_error

HELP = (
    "restore the generation a restart would pick; exit 0 restored, 1 the restore failed, "
    "2 usage or no such job, 3 the structural drill passed but --full could not run"
)
DESCRIPTION = HELP


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from checkpoint_exporter.restore import DEFAULT_FULL_MAX_BYTES

    add_common(parser, config_required=True)
    parser.add_argument("--job", required=True, help="training job name")
    parser.add_argument("--generation", metavar="ID", help="a generation id instead of the newest")
    parser.add_argument(
        "--full",
        action="store_true",
        help="also read all of it in a child process: DCP tensors loaded with "
        "torch.distributed.checkpoint in batches (needs torch; without it the structural drill "
        "runs and the exit status is 3), torch.save files record by record, CRC-32 checked",
    )
    parser.add_argument(
        "--full-max-bytes",
        type=_drill_bound,
        default=DEFAULT_FULL_MAX_BYTES,
        metavar="BYTES",
        help="the most memory --full's loader may take; the generation is loaded in batches "
        f"that fit (default {DEFAULT_FULL_MAX_BYTES} = {DEFAULT_FULL_MAX_BYTES >> 30} GiB)",
    )


def _drill_bound(text: str) -> int:
    from checkpoint_exporter.restore import MIN_FULL_MAX_BYTES

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of bytes: {text!r}") from None
    if value < MIN_FULL_MAX_BYTES:
        raise argparse.ArgumentTypeError(
            f"{value} bytes leaves the loader nothing beside torch: at least {MIN_FULL_MAX_BYTES}"
        )
    return value


def run(args: argparse.Namespace) -> int:
    from checkpoint_exporter.config import ConfigError, load_config
    from checkpoint_exporter.restore import run_drill

    try:
        config = load_config(args.config_file)
    except ConfigError as error:
        return report_config_error(error)
    return run_drill(config, args.job, args.generation, args.full, args.full_max_bytes)
