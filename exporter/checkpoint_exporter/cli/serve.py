"""``serve`` (the default verb): the flags, resolved with the config file into the daemon's
configuration, and the daemon run (daemon/app.py)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from checkpoint_exporter.cli.common import (
    EXIT_USAGE,
    add_common,
    log,
    report_config_error,
)

HELP = "watch checkpoints and serve metrics (default)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from checkpoint_exporter.config import DEFAULT_LISTEN_ADDRESS
    from checkpoint_exporter.exposition.collectors import REGISTRY

    add_common(parser)
    web = parser.add_argument_group("web")
    web.add_argument(
        "--web.listen-address",
        dest="listen_address",
        metavar="HOST:PORT",
        help=f"address to listen on (default {DEFAULT_LISTEN_ADDRESS}, or web.listen_address)",
    )
    web.add_argument(
        "--web.telemetry-path",
        dest="telemetry_path",
        metavar="PATH",
        help="path under which to expose metrics (default /metrics)",
    )
    web.add_argument(
        "--web.config.file",
        dest="web_config_file",
        metavar="FILE",
        help="exporter-toolkit web configuration for TLS and basic auth",
    )
    web.add_argument(
        "--web.disable-exporter-metrics",
        dest="runtime_metrics",
        action="store_false",
        help="do not export the process_* and python_* metrics of the exporter itself "
        "(exported by default, as node_exporter does)",
    )
    web.add_argument(
        "--web.enable-exporter-metrics",
        dest="enable_exporter_metrics_deprecated",
        action="store_true",
        help="deprecated, does nothing: the exporter's own metrics are on by default",
    )
    paths = parser.add_argument_group("paths")
    for name in ("procfs", "sysfs"):
        paths.add_argument(f"--path.{name}", dest=name, metavar="DIR", help=f"{name} mount point")
    paths.add_argument(
        "--path.rootfs",
        dest="rootfs",
        metavar="DIR",
        help="deprecated, does nothing: only the filesystems of watched paths are statvfs'd, "
        "at mountpoints the exporter sees in its own mount namespace",
    )
    fleet = parser.add_argument_group("scopes and sharding")
    fleet.add_argument(
        "--scope",
        metavar="SCOPES",
        help="what this process reads: node (local tiers, the spool, telemetry), shared "
        "(filesystems every node sees), or node,shared (default)",
    )
    fleet.add_argument(
        "--shard",
        metavar="I/N",
        help="with the shared scope: serve the jobs whose name Prometheus' hashmod puts in "
        "shard I of N (default 0/1: every job)",
    )
    collectors = parser.add_argument_group("collectors")
    for name, entry in sorted(REGISTRY.items()):
        default = "enabled" if entry.enabled_by_default else "disabled"
        collectors.add_argument(
            f"--collector.{name}",
            dest=f"collector_{name}",
            action=argparse.BooleanOptionalAction,
            default=None,
            help=f"{entry.help} (default: {default})",
        )


def _load_config(config_file: str | None, serving: Any = None) -> Any:
    from checkpoint_exporter.config import Config, Serving, load_config

    serving = serving or Serving()
    if config_file is None:
        return Config(serving=serving)
    config = load_config(config_file, serving)
    for note in config.warnings:
        log.warning("config: %s", note)
    return config


def _serving(args: argparse.Namespace) -> Any:
    """--scope and --shard; ValueError names the flag and what is wrong."""
    from checkpoint_exporter.config import parse_serving

    return parse_serving(args.scope, args.shard)


def _apply_flags(config: Any, args: argparse.Namespace) -> Any:
    from checkpoint_exporter.config import parse_listen_address

    web = config.web
    if args.listen_address is not None:
        parse_listen_address(args.listen_address)
        web = replace(web, listen_address=args.listen_address)
    if args.telemetry_path is not None:
        if not args.telemetry_path.startswith("/"):
            raise ValueError(
                f"--web.telemetry-path must start with '/', got {args.telemetry_path!r}"
            )
        web = replace(web, telemetry_path=args.telemetry_path)
    if args.web_config_file is not None:
        web = replace(web, config_file=Path(args.web_config_file))
    paths = replace(
        config.paths,
        **{
            name: Path(getattr(args, name))
            for name in ("procfs", "sysfs", "rootfs")
            if getattr(args, name)
        },
    )
    return replace(config, web=web, paths=paths)


def configuration(args: argparse.Namespace) -> Any:
    """The config file read as the flags say, with the flags over it: at start, and again on
    each SIGHUP. ConfigError, or ValueError naming a flag."""
    return _apply_flags(_load_config(args.config_file, _serving(args)), args)


def run(args: argparse.Namespace) -> int:
    from checkpoint_exporter.config import ConfigError
    from checkpoint_exporter.daemon.app import App

    try:
        config = configuration(args)
    except ConfigError as error:
        return report_config_error(error)
    except ValueError as error:
        print(f"checkpoint-exporter: {error}", file=sys.stderr)
        return EXIT_USAGE
    if args.rootfs:
        log.warning(
            "--path.rootfs is deprecated and does nothing: the exporter statvfs's only the "
            "filesystems of the paths it watches, at mountpoints in its own mount namespace"
        )
    if args.enable_exporter_metrics_deprecated:
        log.warning(
            "--web.enable-exporter-metrics is deprecated and does nothing: the exporter's own "
            "metrics are on by default (--web.disable-exporter-metrics turns them off)"
        )
    security = None
    if config.web.config_file is not None:
        from checkpoint_exporter.webconfig import load_web_config

        try:
            security = load_web_config(config.web.config_file)
        except ConfigError as error:
            return report_config_error(error)
    from checkpoint_exporter.exposition.collectors import REGISTRY

    collectors = {
        name: getattr(args, f"collector_{name}")
        for name in REGISTRY
        if getattr(args, f"collector_{name}") is not None
    }
    app = App(
        config,
        security=security,
        collectors=collectors,
        runtime_metrics=args.runtime_metrics,
        reread=lambda: configuration(args),
    )
    return app.run()
