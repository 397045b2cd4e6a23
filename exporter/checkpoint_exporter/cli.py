"""The ``checkpoint-exporter`` command: serve (default) | check-config | plan | restore-drill |
rules | dashboards | demo | acceptance | healthcheck.

Exit status: 0 ok, 2 usage or configuration error, 1 runtime failure.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from checkpoint_exporter import __version__, logs

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2
VERBS = (
    "serve", "check-config", "plan", "restore-drill", "rules", "dashboards", "demo", "acceptance",
    "healthcheck",
)  # fmt: skip

log = logging.getLogger("checkpoint_exporter")


def _add_common(parser: argparse.ArgumentParser, config_required: bool = False) -> None:
    parser.add_argument(
        "--config.file",
        dest="config_file",
        metavar="FILE",
        required=config_required,
        help="exporter configuration (YAML)",
    )
    parser.add_argument("--log.level", dest="log_level", choices=logs.LEVELS, default="info")
    parser.add_argument("--log.format", dest="log_format", choices=logs.FORMATS, default="logfmt")


def _add_serve(parser: argparse.ArgumentParser) -> None:
    from checkpoint_exporter.config import DEFAULT_LISTEN_ADDRESS
    from checkpoint_exporter.exposition.collectors import REGISTRY

    _add_common(parser)
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


def _add_plan(parser: argparse.ArgumentParser) -> None:
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
    _refuse_unknown_flags(parser)


def _refuse_unknown_flags(parser: argparse.ArgumentParser) -> None:
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


def _add_acceptance(parser: argparse.ArgumentParser) -> None:
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="checkpoint-exporter",
        description="Prometheus exporter for GPU training checkpoints. "
        "Without a verb, runs `serve`.",
    )
    parser.add_argument("--version", action="version", version=f"checkpoint-exporter {__version__}")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB")
    _add_serve(verbs.add_parser("serve", help="watch checkpoints and serve metrics (default)"))
    check = verbs.add_parser("check-config", help="validate a config file and print it resolved")
    _add_common(check, config_required=True)
    _add_plan(verbs.add_parser("plan", help="sizing worksheet: model and cluster -> objectives"))
    drill_help = (
        "restore the generation a restart would pick; exit 0 restored, 1 the restore failed, "
        "2 usage or no such job, 3 the structural drill passed but --full could not run"
    )
    drill = verbs.add_parser("restore-drill", help=drill_help, description=drill_help)
    _add_common(drill, config_required=True)
    drill.add_argument("--job", required=True, help="training job name")
    drill.add_argument("--generation", metavar="ID", help="a generation id instead of the newest")
    drill.add_argument(
        "--full",
        action="store_true",
        help="also read all of it in a child process: DCP tensors loaded with "
        "torch.distributed.checkpoint in batches (needs torch; without it the structural drill "
        "runs and the exit status is 3), torch.save files record by record, CRC-32 checked",
    )
    from checkpoint_exporter.restore import DEFAULT_FULL_MAX_BYTES

    drill.add_argument(
        "--full-max-bytes",
        type=_drill_bound,
        default=DEFAULT_FULL_MAX_BYTES,
        metavar="BYTES",
        help="the most memory --full's loader may take; the generation is loaded in batches "
        f"that fit (default {DEFAULT_FULL_MAX_BYTES} = {DEFAULT_FULL_MAX_BYTES >> 30} GiB)",
    )
    demo = verbs.add_parser(
        "demo", help="a small simulated cluster on this machine, watched by the real exporter"
    )
    demo.add_argument("--workdir", metavar="DIR", help="keep its files here (default: temporary)")
    demo.add_argument("--duration", type=float, metavar="SECONDS", help="stop after this long")
    demo.add_argument(
        "--port",
        type=int,
        default=25780,
        help="the exporter's; Prometheus +10, Alertmanager +11, node_exporter +12",
    )
    _add_acceptance(
        verbs.add_parser(
            "acceptance",
            help="judge a storage system's deployment acceptance checklist (known checkpoint, "
            "concurrent burst, repeatability, interrupted save, recovery drill, handover) from a "
            "Prometheus over a time range: HTML, JSON and Markdown report; exit 1 when a "
            "measured row fails",
        )
    )
    for verb, what, default in (
        ("rules", "alert and recording rules (and a PrometheusRule)", "alerts"),
        ("dashboards", "Grafana dashboards", "dashboards"),
    ):
        generator = verbs.add_parser(verb, help=f"generate the {what}")
        generator.add_argument(
            "--config.file",
            dest="config_file",
            metavar="FILE",
            help="mixin config (YAML): selector, severities, `for` durations, runbook URL, SLO",
        )
        generator.add_argument(
            "--output-dir", default=default, metavar="DIR", help=f"(default: ./{default})"
        )
        manifest = "PrometheusRule" if verb == "rules" else "dashboards ConfigMap"
        generator.add_argument(
            "--kubernetes-dir",
            metavar="DIR",
            help=f"also write the {manifest} manifest here (default: not written)",
        )
    _add_healthcheck(verbs)
    return parser


def _with_default_verb(argv: Sequence[str]) -> list[str]:
    argv = list(argv)
    if argv and (argv[0] in VERBS or argv[0] in ("-h", "--help", "--version")):
        return argv
    return ["serve", *argv]


# --- verbs -------------------------------------------------------------------------------------


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


def _report_config_error(error: Exception) -> int:
    problems = getattr(error, "problems", [])
    noun = "problem" if len(problems) == 1 else "problems"
    print(f"configuration has {len(problems)} {noun}:", file=sys.stderr)
    for problem in problems:
        print(f"  {problem}", file=sys.stderr)
    return EXIT_USAGE


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


class _Signals:
    """SIGTERM / SIGINT stop, SIGHUP reloads the configuration. The handler only records the
    signal and the main thread polls for it: a handler must take no lock (it runs between two
    bytecodes of the main thread, which may hold that very lock)."""

    def __init__(self) -> None:
        self.stop: int | None = None
        self.reloads = 0
        signal.signal(signal.SIGTERM, self._handle)
        signal.signal(signal.SIGINT, self._handle)
        signal.signal(signal.SIGHUP, self._handle)

    def _handle(self, signum: int, _frame: object) -> None:
        if signum == signal.SIGHUP:
            self.reloads += 1
        else:
            self.stop = signum

    def wait(self, handled_reloads: int) -> str:
        """Returns "stop", or "reload" once more SIGHUPs came than ``handled_reloads``."""
        while self.stop is None and self.reloads == handled_reloads:
            time.sleep(0.1)
        return "stop" if self.stop is not None else "reload"


def _reload_config(args: argparse.Namespace, scanner: Any) -> None:
    """Read the file again as at start (same loader, same flag overrides); a bad file is
    logged and the running configuration kept."""
    from checkpoint_exporter.config import ConfigError

    try:
        config = _apply_flags(_load_config(args.config_file, _serving(args)), args)
    except ConfigError as error:
        for problem in getattr(error, "problems", []) or [error]:
            log.error("configuration reload failed, keeping the running one: %s", problem)
        scanner.reload_failed()
        return
    except (OSError, ValueError) as error:
        log.error("configuration reload failed, keeping the running one: %s", error)
        scanner.reload_failed()
        return
    log.info("reloading configuration from %s", config.source or "defaults")
    scanner.reload(config)


def _serve(args: argparse.Namespace) -> int:
    from checkpoint_exporter.config import ConfigError
    from checkpoint_exporter.core.tracker import Tracker
    from checkpoint_exporter.daemon.scanner import Scanner
    from checkpoint_exporter.exposition.collectors import REGISTRY, enabled_collectors
    from checkpoint_exporter.exposition.renderer import Renderer, runtime_registry
    from checkpoint_exporter.exposition.server import MetricsServer
    from checkpoint_exporter.sources.telemetry.node import NodeTelemetry

    try:
        config = _apply_flags(_load_config(args.config_file, _serving(args)), args)
    except ConfigError as error:
        return _report_config_error(error)
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
            return _report_config_error(error)
    choices = {
        name: getattr(args, f"collector_{name}")
        for name in REGISTRY
        if getattr(args, f"collector_{name}") is not None
    }
    tracker = Tracker(config)
    telemetry = NodeTelemetry(config)
    # Builds no tree and touches no watched path: every read runs behind the open port.
    scanner = Scanner(config, tracker, telemetry=telemetry)

    def snapshot() -> Any:
        return tracker.snapshot

    runtime = runtime_registry() if args.runtime_metrics else None
    renderer = Renderer(snapshot, enabled_collectors(choices), runtime)
    try:
        server = MetricsServer(
            config.web,
            renderer,
            security,
            liveness=scanner.liveness,
            readiness=scanner.readiness,
        )
    except OSError as error:
        log.error("cannot listen on %s: %s", config.web.listen_address, error.strerror or error)
        return EXIT_FAILURE
    signals = _Signals()
    server.start()
    log.info(
        "listening: address=%s url=%s jobs=%d config=%s",
        server.address,
        server.url,
        len(config.jobs),
        config.source or "none",
    )
    if not config.serving.default:
        log.info("serving: scope=%s shard=%d/%d", config.serving.scope_label,
                 config.serving.shard, config.serving.shards)  # fmt: skip
    scanner.start()
    telemetry.start()
    handled, reloading = 0, None
    while signals.wait(handled) == "reload":
        if reloading is not None and reloading.is_alive():
            time.sleep(0.1)  # one reload at a time; SIGHUPs meanwhile make one more
            continue
        handled = signals.reloads
        # Off the main thread: loading checks the jobs' directories, and a stat on a hung mount
        # must not keep this thread from answering SIGTERM.
        reloading = threading.Thread(
            target=_reload_config, args=(args, scanner), name="reload", daemon=True
        )
        reloading.start()
    assert signals.stop is not None
    log.info("stopping on %s", signal.Signals(signals.stop).name)
    server.stop()
    scanner.stop()
    telemetry.stop()
    return EXIT_OK


def _check_config(args: argparse.Namespace) -> int:
    import yaml

    from checkpoint_exporter.config import ConfigError, config_to_dict, load_config

    try:
        config = load_config(args.config_file)
    except ConfigError as error:
        return _report_config_error(error)
    sys.stdout.write(yaml.safe_dump(config_to_dict(config), sort_keys=False))
    for note in config.warnings:
        print(f"warning: {note}", file=sys.stderr)
    print(
        f"{args.config_file}: ok ({len(config.jobs)} jobs, {len(config.discover)} discover roots)",
        file=sys.stderr,
    )
    return EXIT_OK


def _plan(args: argparse.Namespace) -> int:
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


def _restore_drill(args: argparse.Namespace) -> int:
    from checkpoint_exporter.config import ConfigError, load_config
    from checkpoint_exporter.restore import run_drill

    try:
        config = load_config(args.config_file)
    except ConfigError as error:
        return _report_config_error(error)
    return run_drill(config, args.job, args.generation, args.full, args.full_max_bytes)


def _generate(args: argparse.Namespace) -> int:
    from checkpoint_exporter.config import ConfigError
    from checkpoint_exporter.mixin.config import load_mixin
    from checkpoint_exporter.mixin.generate import write_outputs

    try:
        mixin = load_mixin(args.config_file)
    except ConfigError as error:
        return _report_config_error(error)
    targets = {args.verb: Path(args.output_dir)}
    if args.kubernetes_dir:
        manifest = "prometheusrule" if args.verb == "rules" else "dashboards-configmap"
        targets[manifest] = Path(args.kubernetes_dir)
    for path in write_outputs(mixin, targets):
        print(f"wrote {path}")
    return EXIT_OK


def _acceptance(args: argparse.Namespace) -> int:
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


def _demo(args: argparse.Namespace) -> int:
    from checkpoint_exporter.demo.cluster import run

    return run(Path(args.workdir) if args.workdir else None, args.duration, args.port)


# --- healthcheck: the container's HEALTHCHECK --------------------------------------------------

# Below the Dockerfile's HEALTHCHECK --timeout, so the probe says why it failed before the
# engine kills it.
HEALTHCHECK_TIMEOUT_SECONDS = 3.0


def _add_healthcheck(verbs: Any) -> None:
    healthcheck_help = (
        "probe a running serve's /healthz where its flags and config file say it listens, over "
        "TLS when its web config turns TLS on; exit 0 healthy, 1 not (a container HEALTHCHECK)"
    )
    parser = verbs.add_parser(
        "healthcheck",
        help=healthcheck_help,
        description=healthcheck_help + ". Takes serve's flags, so it can be given serve's very "
        "command line; it reads only the web ones (--config.file's web: block, "
        "--web.listen-address, --web.config.file).",
    )
    _add_serve(parser)
    probe = parser.add_argument_group("probe")
    probe.add_argument(
        "--probe.timeout",
        dest="probe_timeout",
        type=float,
        default=HEALTHCHECK_TIMEOUT_SECONDS,
        metavar="SECONDS",
        help=f"give up after this long (default {HEALTHCHECK_TIMEOUT_SECONDS:g})",
    )
    probe.add_argument(
        "--probe.cert-file",
        dest="probe_cert_file",
        metavar="FILE",
        help="a client certificate (PEM) to present, for a web config that requires one "
        "(client_auth_type: RequireAndVerifyClientCert)",
    )
    probe.add_argument(
        "--probe.key-file", dest="probe_key_file", metavar="FILE", help="its private key"
    )


def _healthcheck(args: argparse.Namespace) -> int:
    """GET /healthz of the serve these flags describe; every failure is exit 1 (Docker reserves
    2). The certificate is not verified: the probe connects to the address serve itself listens
    on, on this host, to learn whether it is alive (a certificate naming 127.0.0.1 is rare, and
    its CA need not be in the image)."""
    import ssl
    import urllib.error
    import urllib.request

    from checkpoint_exporter.config import ConfigError

    try:
        url, tls = _healthcheck_target(args)
        context = None
        if tls is not None:
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
            if args.probe_cert_file:
                context.load_cert_chain(args.probe_cert_file, args.probe_key_file)
    except ConfigError as error:
        _report_config_error(error)
        return EXIT_FAILURE
    except (OSError, ValueError) as error:
        print(f"healthcheck: {error}", file=sys.stderr)
        return EXIT_FAILURE
    try:
        with urllib.request.urlopen(url, timeout=args.probe_timeout, context=context) as answer:
            body = answer.read(256).decode(errors="replace").strip()
    except urllib.error.HTTPError as error:
        reason = error.read(256).decode(errors="replace").strip()
        print(f"healthcheck: {url}: {error.code} {reason}", file=sys.stderr)
        return EXIT_FAILURE
    except (OSError, ValueError) as error:  # refused, timed out, the handshake refused
        hint = ""
        if tls is not None and tls.verify_mode == ssl.CERT_REQUIRED and not args.probe_cert_file:
            hint = " (the web config requires a client certificate: give --probe.cert-file)"
        print(f"healthcheck: {url}: {getattr(error, 'reason', error)}{hint}", file=sys.stderr)
        return EXIT_FAILURE
    print(f"{url}: {body}")
    return EXIT_OK


def _healthcheck_target(args: argparse.Namespace) -> tuple[str, Any]:
    """(the /healthz URL, the server's TLS context or None), resolved as serve resolves its
    listen address and web config: the flags over the config file's web: block."""
    from checkpoint_exporter.config import WebConfig, load_web_section, parse_listen_address
    from checkpoint_exporter.webconfig import load_web_config

    if bool(args.probe_cert_file) != bool(args.probe_key_file):
        raise ValueError("--probe.cert-file and --probe.key-file go together")
    web = load_web_section(args.config_file) if args.config_file else WebConfig()
    address = parse_listen_address(args.listen_address or web.listen_address)
    security_file = args.web_config_file or web.config_file
    tls = load_web_config(Path(security_file)).tls if security_file else None
    # Every interface ("", 0.0.0.0, ::) includes loopback; a named host is where serve bound.
    host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(address.host, address.host)
    host = f"[{host}]" if ":" in host else host
    return f"{'https' if tls else 'http'}://{host}:{address.port}/healthz", tls


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(_with_default_verb(sys.argv[1:] if argv is None else argv))
    logs.setup(getattr(args, "log_level", "info"), getattr(args, "log_format", "logfmt"))
    handler = {
        "serve": _serve,
        "check-config": _check_config,
        "plan": _plan,
        "restore-drill": _restore_drill,
        "rules": _generate,
        "dashboards": _generate,
        "demo": _demo,
        "acceptance": _acceptance,
        "healthcheck": _healthcheck,
    }[args.verb]
    try:
        return handler(args)
    except KeyboardInterrupt:
        return EXIT_FAILURE
