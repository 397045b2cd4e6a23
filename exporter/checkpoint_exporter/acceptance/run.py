"""The ``acceptance`` verb: objectives from the config files, every query against Prometheus,
the rows, the report, the exit status (0 every measured row passed, 1 a measured row failed,
2 bad input or Prometheus unreachable)."""

from __future__ import annotations

import logging
import math
import re
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TextIO

from checkpoint_exporter import __version__
from checkpoint_exporter.acceptance.prom import (
    PrometheusClient,
    PrometheusError,
    TimeRange,
    iso,
    time_range,
)
from checkpoint_exporter.acceptance.queries import RANGE, build_queries
from checkpoint_exporter.acceptance.report import Report, build_charts, summary_lines, write
from checkpoint_exporter.acceptance.rows import ROWS, Context, Objectives, Row
from checkpoint_exporter.schema import ConfigError
from checkpoint_exporter.units import parse_duration

log = logging.getLogger(__name__)

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
DEFAULT_SELECTOR = 'job="checkpoint-exporter"'  # the mixin's default selector
# Series whose training_job labels name the jobs seen in the range.
JOB_QUERIES = ("interval", "deadline", "size_bytes", "committed", "restores")
CHART_QUERIES = (
    "save_total_range",
    "backlog_range",
    "retained_range",
    "retention_limit",
    "restores",
    "restore_failures",
    "exporter_rss_range",
    "deadline",
)


class UsageError(Exception):
    """Bad input: the message says which argument and why."""


@dataclass(frozen=True)
class Request:
    prometheus_url: str
    start: str | None = None
    end: str | None = None
    span: str | None = None
    config_file: str | None = None
    objectives_file: str | None = None
    parameters: str | float | None = None  # 70e9 or 70B, as plan reads it
    bytes_per_parameter: float = 14.0
    size_tolerance: float = 0.12
    output: str = "acceptance"
    jobs: tuple[str, ...] = ()
    selector: str = DEFAULT_SELECTOR
    timeout: float = 30.0


# --- objectives -----------------------------------------------------------------------------------


def _problems(error: ConfigError) -> str:
    return "; ".join(str(p) for p in getattr(error, "problems", [])) or str(error)


def config_objectives(path: str) -> tuple[dict[str, Objectives], Objectives | None]:
    """Per-job objectives of an exporter config, and the one policy for jobs it does not name
    (its single discover root's, else its defaults). Its directories are not checked: the
    report runs where the checkpoints are not mounted."""
    from checkpoint_exporter.config import Serving, load_config

    try:
        config = load_config(path, Serving(scopes=frozenset()))
    except ConfigError as error:
        raise UsageError(f"--config.file {path}: {_problems(error)}") from None

    def of(policy: object, where: str) -> Objectives:
        return Objectives(
            interval=policy.interval,  # type: ignore[attr-defined]
            deadline=policy.deadline,  # type: ignore[attr-defined]
            retained_generations=float(policy.retained_generations),  # type: ignore[attr-defined]
            restore_drill_max_age=policy.restore_drill_max_age,  # type: ignore[attr-defined]
            mtbf=policy.mtbf,  # type: ignore[attr-defined]
            source=where,
        )

    named = {job.name: of(job.policy, f"{path} jobs[{job.name}]") for job in config.jobs}
    if len(config.discover) == 1:
        rest = of(config.discover[0].policy, f"{path} discover[{config.discover[0].root}]")
    else:
        rest = of(config.defaults, f"{path} defaults") if not config.discover else None
    return named, rest


OBJECTIVE_KEYS = {
    "interval": "interval",
    "deadline": "deadline",
    "retained_generations": "retained_generations",
    "restore_drill_max_age": "restore_drill_max_age",
    "mtbf": "mtbf",
}


def plan_objectives(path: str) -> Objectives:
    """The ``defaults:`` block that ``plan --emit-objectives`` prints: only the keys it holds
    are objectives (a key it leaves out is not agreed, so it is not compared)."""
    from checkpoint_exporter.schema import read_mapping_file

    try:
        data, problems = read_mapping_file(path)
    except ConfigError as error:
        raise UsageError(f"--objectives {path}: {_problems(error)}") from None
    if problems.found:
        raise UsageError(f"--objectives {path}: {'; '.join(str(p) for p in problems.found)}")
    block = data.get("defaults", data)  # the block itself, or a bare mapping of the keys
    if not isinstance(block, dict):
        raise UsageError(f"--objectives {path}: expected a defaults: mapping")
    values: dict[str, float] = {}
    for key, field_name in OBJECTIVE_KEYS.items():
        if block.get(key) is None:
            continue
        try:
            if key == "retained_generations":
                number = block[key]
                if isinstance(number, bool) or not isinstance(number, int) or number < 1:
                    raise ValueError(f"expected a whole number of generations, got {number!r}")
                values[field_name] = float(number)
            else:
                values[field_name] = parse_duration(block[key])
        except ValueError as error:
            raise UsageError(f"--objectives {path}: defaults.{key}: {error}") from None
    if not values:
        raise UsageError(
            f"--objectives {path}: no interval, deadline, retained_generations, "
            "restore_drill_max_age or mtbf in it"
        )
    return Objectives(**values, source=path)


def resolve_objectives(
    jobs: Sequence[str],
    named: Mapping[str, Objectives],
    rest: Objectives | None,
    plan: Objectives | None,
) -> dict[str, Objectives]:
    """A job named in the exporter config keeps its own entry; every other job takes the plan's
    objectives, else the config's policy for unnamed jobs."""
    out: dict[str, Objectives] = {}
    for job in jobs:
        chosen = named.get(job) or plan or rest
        if chosen is not None:
            out[job] = chosen
    return out


_SCALE = {"K": 1e3, "M": 1e6, "B": 1e9, "T": 1e12}


def parse_parameters(value: str | float | None) -> float | None:
    """--parameters as plan reads it: 70e9, 70_000_000_000 or 70B (K, M, B, T)."""
    if value is None:
        return None
    text = str(value).strip().replace("_", "").replace(",", "")
    match = re.fullmatch(r"([0-9.eE+-]+)([KMBT])", text)
    try:
        number = float(match.group(1)) * _SCALE[match.group(2)] if match else float(text)
    except ValueError:
        number = math.nan
    if not math.isfinite(number) or number <= 0:
        raise UsageError(
            f"--parameters: expected a positive count such as 70e9 or 70B, got {value!r}"
        )
    return number


# --- the run --------------------------------------------------------------------------------------


def _jobs_seen(results: Mapping[str, Sequence[object]]) -> list[str]:
    seen: set[str] = set()
    for name in JOB_QUERIES:
        for sample in results.get(name, ()):
            job = sample.label("training_job")  # type: ignore[attr-defined]
            if job:
                seen.add(job)
    return sorted(seen)


def collect(client: PrometheusClient, request: Request, span: TimeRange) -> dict[str, list]:
    queries = build_queries(request.selector, span.start, span.end, span.step)
    wanted = {name for _, names, _ in ROWS for name in names} | set(CHART_QUERIES)
    wanted |= set(JOB_QUERIES)
    results: dict[str, list] = {}
    for name in sorted(wanted):
        query = queries[name]
        if query.kind == RANGE:
            results[name] = client.query_range(query.expr, span.start, span.end, span.step)
        else:
            results[name] = client.query(query.expr, span.end)
    return results


def judge(results: Mapping[str, Sequence[object]], ctx: Context, selector: str) -> tuple[Row, ...]:
    """Every row, each with the PromQL it read (as collect() ran it over the context's range)."""
    span = TimeRange(ctx.start, ctx.end)
    queries = build_queries(selector, span.start, span.end, span.step)
    rows = []
    for _key, names, function in ROWS:
        row = function(results, ctx)  # type: ignore[arg-type]
        rows.append(replace(row, queries=tuple((n, queries[n].expr) for n in names)))
    return tuple(rows)


def _report(
    request: Request,
    span: TimeRange,
    now: float,
    jobs: list[str],
    notes: list[str],
    results: dict[str, list],
    objectives: dict[str, Objectives],
    parameters: float | None,
) -> Report:
    """The rows and charts judged from ``results``, as a report."""
    ctx = Context(
        jobs=tuple(jobs),
        start=span.start,
        end=span.end,
        objectives=objectives,
        parameters=parameters,
        bytes_per_parameter=request.bytes_per_parameter,
        size_tolerance=request.size_tolerance,
        config_file=request.config_file,
    )
    sources = sorted({o.source.split(" ")[0] for o in objectives.values()})
    return Report(
        prometheus_url=request.prometheus_url,
        selector=request.selector,
        start=span.start,
        end=span.end,
        generated=now,
        version=__version__,
        jobs=tuple(jobs),
        rows=judge(results, ctx, request.selector),
        charts=build_charts(results, ctx),  # type: ignore[arg-type]
        objectives_from=tuple(sources),
        notes=tuple(notes),
    )


def run(request: Request, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    now = time.time()
    try:
        span = time_range(request.start, request.end, request.span, now)
        named, rest = config_objectives(request.config_file) if request.config_file else ({}, None)
        plan = plan_objectives(request.objectives_file) if request.objectives_file else None
        parameters = parse_parameters(request.parameters)
        if not request.bytes_per_parameter > 0:
            raise UsageError("--bytes-per-parameter must be positive")
        if not 0 < request.size_tolerance < 1:
            raise UsageError("--size-tolerance must lie between 0 and 1 (a fraction)")
    except (ValueError, UsageError) as error:
        print(f"acceptance: {error}", file=err)
        return EXIT_USAGE
    client = PrometheusClient(request.prometheus_url, request.timeout)
    try:
        client.reachable()
        results = collect(client, request, span)
    except PrometheusError as error:
        print(f"acceptance: {error}", file=err)
        return EXIT_USAGE
    seen = _jobs_seen(results)
    notes: list[str] = []
    if request.jobs:
        jobs = list(dict.fromkeys(request.jobs))
        missing = [job for job in jobs if job not in seen]
        if missing:
            notes.append(
                f"no series of {', '.join(missing)} in the range: their rows cannot be measured"
            )
    else:
        jobs = seen
    if not seen:
        # Never let a gate pass on no data: a wrong selector or range is an input error.
        print(
            f"acceptance: no checkpoint-exporter series match {{{request.selector}}} at "
            f"{request.prometheus_url} between {iso(span.start)} and {iso(span.end)}: check "
            "--prometheus.url, --selector and the time range",
            file=err,
        )
        return EXIT_USAGE
    objectives = resolve_objectives(jobs, named, rest, plan)
    try:
        report = _report(request, span, now, jobs, notes, results, objectives, parameters)
        paths = write(report, Path(request.output))
    except OSError as error:
        print(
            f"acceptance: cannot write the report to {request.output}: {error.strerror or error}",
            file=err,
        )
        return EXIT_USAGE
    except (ArithmeticError, ValueError, TypeError, LookupError, RecursionError) as error:
        # Whatever the answers held that the client let through: still bad input, never a
        # traceback, and never exit 1 (which says a measured row failed).
        log.debug("judging the answers failed", exc_info=True)
        print(
            f"acceptance: cannot judge the answers of Prometheus at {request.prometheus_url}: "
            f"{type(error).__name__}: {error}",
            file=err,
        )
        return EXIT_USAGE
    for line in summary_lines(report):
        print(line, file=out)
    verdict = {0: "every measured row passed", 1: "a measured row failed"}[report.exit_status]
    print(
        f"acceptance: {verdict} ({len(jobs)} jobs, {iso(span.start)} to {iso(span.end)}); "
        f"report: {', '.join(paths)}",
        file=out,
    )
    return report.exit_status
