"""The checklist rows of the seed article's section 8, each a pure function of query results.

A row says ``pass``, ``fail`` or ``not measured``, per training job and overall, with the values
behind the verdict; the runner attaches the PromQL it ran. A row fails when any job fails it;
it passes when some job passed and none failed; otherwise the data could not judge it, and the
row says what to run so that it can. The symptoms row is ``info``: it reports, never judges.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from checkpoint_exporter.acceptance.prom import Sample, Series
from checkpoint_exporter.acceptance.queries import NO_RECOVERABLE_FOR
from checkpoint_exporter.units import format_duration

PASS, FAIL, NOT_MEASURED = "pass", "fail", "not measured"
INFO = "info"  # a row that reports and never judges: it leaves the exit status alone
PHASES = ("pause", "staging", "write", "commit", "total")

# Known checkpoint: how far the measured size may stray from parameters x bytes_per_parameter.
# The seed's ledger is 14 B a parameter (2 weights + 4 master weights + 2 x 4 optimizer) plus a
# chosen 10% allowance for other state. The smallest whole piece of state a layout can drop or
# duplicate is one bf16 copy of the weights, 2 of 14 B = 14.3%; 12% admits the allowance and
# still catches that. With another ledger, pick a tolerance below its smallest piece / b.
SIZE_TOLERANCE = 0.12
# Repeatability: the exporter's resident memory counts as growing when its floor over the last
# third of the run is a quarter above its peak over the first third. Allocator and collector
# jitter move a Python process by a few percent; the first third holds the start-up peak.
MEMORY_GROWTH = 1.25
MIN_SAVES_FOR_TREND = 3  # "enough successive intervals": fewer saves cannot show a trend
MIN_POINTS_FOR_TREND = 6

Results = Mapping[str, Sequence[Sample] | Sequence[Series]]


@dataclass(frozen=True)
class Objectives:
    """A job's agreed objectives (seconds, generations), from a config file; None: not given."""

    interval: float | None = None
    deadline: float | None = None
    retained_generations: float | None = None
    restore_drill_max_age: float | None = None
    mtbf: float | None = None
    source: str = ""


@dataclass(frozen=True)
class Context:
    """What the rows need beside the query results."""

    jobs: tuple[str, ...]  # the jobs judged (those seen, or those asked for with --job)
    start: float
    end: float
    objectives: Mapping[str, Objectives] = field(default_factory=dict)
    parameters: float | None = None
    bytes_per_parameter: float = 14.0
    size_tolerance: float = SIZE_TOLERANCE
    config_file: str | None = None  # the exporter config, for the recovery commands


@dataclass(frozen=True)
class JobVerdict:
    verdict: str
    reasons: tuple[str, ...] = ()
    values: Mapping[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class Row:
    key: str
    title: str
    checklist: str  # the seed's checklist item, in short
    verdict: str
    summary: str
    jobs: Mapping[str, JobVerdict] = field(default_factory=dict)
    values: Mapping[str, object] = field(default_factory=dict)
    what_to_run: str | None = None
    queries: tuple[tuple[str, str], ...] = ()  # (name, PromQL), attached by the runner


# --- reading query results ----------------------------------------------------------------------


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def per_job(results: Results, name: str) -> dict[str, float]:
    """{training_job: value} of an instant vector; NaN (0/0) is left out."""
    out: dict[str, float] = {}
    for sample in results.get(name, ()):
        if isinstance(sample, Sample) and _finite(sample.value) is not None:
            out[sample.label("training_job")] = sample.value
    return out


def per_job_label(results: Results, name: str, label: str) -> dict[str, dict[str, float]]:
    """{training_job: {label value: value}}."""
    out: dict[str, dict[str, float]] = {}
    for sample in results.get(name, ()):
        if isinstance(sample, Sample) and _finite(sample.value) is not None:
            out.setdefault(sample.label("training_job"), {})[sample.label(label)] = sample.value
    return out


def series_by(results: Results, name: str, label: str = "training_job") -> dict[str, list]:
    """{label value: [(t, v), ...]} of a range query."""
    out: dict[str, list] = {}
    for series in results.get(name, ()):
        if isinstance(series, Series):
            points = [(t, v) for t, v in series.points if math.isfinite(v)]
            out[series.label(label)] = points
    return out


def count(value: float | None) -> int:
    """A counter's increase() as a whole number: Prometheus extrapolates to the range's edges,
    so one event can read 1.04; any increase at all is at least one event."""
    if value is None or value <= 0:
        return 0
    return max(1, round(value))


def seconds(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:.2f}s" if value < 100 else format_duration(round(value))


def nbytes(value: float | None) -> str:
    if value is None:
        return "—"
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(value) >= size:
            return f"{value / size:.2f} {unit}"
    return f"{value:.0f} B"


def combine(jobs: Mapping[str, JobVerdict]) -> str:
    verdicts = {job.verdict for job in jobs.values()}
    if FAIL in verdicts:
        return FAIL
    return PASS if PASS in verdicts else NOT_MEASURED


def _failing(jobs: Mapping[str, JobVerdict]) -> str:
    return "; ".join(
        f"{name}: {verdict.reasons[0]}"
        for name, verdict in jobs.items()
        if verdict.verdict == FAIL and verdict.reasons
    )


def _summary(jobs: Mapping[str, JobVerdict], passed: str, unmeasured: str) -> str:
    verdict = combine(jobs)
    if verdict == FAIL:
        return _failing(jobs)
    if verdict == PASS:
        measured = sum(1 for job in jobs.values() if job.verdict == PASS)
        return f"{measured} of {len(jobs)} jobs: {passed}"
    return unmeasured


def deadline_of(ctx: Context, results: Results, job: str) -> tuple[float | None, str]:
    """The agreed deadline (a config file), else the one the exporter exports."""
    agreed = ctx.objectives.get(job)
    if agreed is not None and agreed.deadline is not None:
        return agreed.deadline, agreed.source
    exported = per_job(results, "deadline").get(job)
    return exported, "exported checkpoint_deadline_seconds"


def thirds(points: Sequence[tuple[float, float]]) -> tuple[list[float], list[float]] | None:
    """The values of the first and the last third of a series; None when too short to tell."""
    if len(points) < MIN_POINTS_FOR_TREND:
        return None
    third = len(points) // 3
    return [v for _, v in points[:third]], [v for _, v in points[-third:]]


# --- the rows -------------------------------------------------------------------------------------


def known_checkpoint(results: Results, ctx: Context) -> Row:
    sizes, files = per_job(results, "size_bytes"), per_job(results, "files")
    valid_min = per_job(results, "valid_min")
    failures = per_job_label(results, "validation_failures", "reason")
    written = per_job_label(results, "node_written_bytes", "instance")
    expected = ctx.parameters * ctx.bytes_per_parameter if ctx.parameters else None
    jobs: dict[str, JobVerdict] = {}
    for job in ctx.jobs:
        size = sizes.get(job)
        if size is None:
            jobs[job] = JobVerdict(NOT_MEASURED, ("no committed generation in the range",))
            continue
        n_files = files.get(job)
        nodes = {node: v for node, v in written.get(job, {}).items() if v > 0}
        values: dict[str, object] = {
            "bytes": size,
            "files": n_files,
            "mean_file_bytes": size / n_files if n_files else None,
            "node_written_bytes": nodes,
            "node_imbalance": max(nodes.values()) / min(nodes.values()) if len(nodes) > 1 else None,
            "validation_failures": {r: count(v) for r, v in failures.get(job, {}).items() if v > 0},
            "newest_valid_min": valid_min.get(job),
        }
        reasons: list[str] = []
        broken = values["validation_failures"]
        if broken or valid_min.get(job) == 0:
            why = ", ".join(f"{reason} x{n}" for reason, n in sorted(broken.items())) or "invalid"
            reasons.append(f"a committed generation failed structural validation ({why})")
        if expected:
            ratio = size / expected
            values.update(expected_bytes=expected, ratio_to_plan=ratio)
            if abs(ratio - 1) > ctx.size_tolerance:
                reasons.append(
                    f"{nbytes(size)} is {ratio - 1:+.0%} off the plan's {ctx.parameters:g} x "
                    f"{ctx.bytes_per_parameter:g} B = {nbytes(expected)} (tolerance "
                    f"{ctx.size_tolerance:.0%}): replace the bytes-per-parameter assumption"
                )
        if reasons:
            jobs[job] = JobVerdict(FAIL, tuple(reasons), values)
            continue
        note = f"{nbytes(size)} in {f'{n_files:g}' if n_files is not None else '?'} files"
        if expected:
            note += f", {size / expected - 1:+.1%} from the plan's {nbytes(expected)}"
        jobs[job] = JobVerdict(PASS, (note,), values)
    compared = "against the plan" if expected else "(no --parameters: not compared with a plan)"
    return Row(
        "known_checkpoint",
        "Known checkpoint",
        "Record unique bytes, file count and shard distribution; compare with the 14-byte "
        "assumption.",
        combine(jobs),
        _summary(jobs, f"bytes and files recorded {compared}", "no committed generation seen"),
        jobs,
        {
            "size_tolerance": ctx.size_tolerance,
            "bytes_per_parameter": ctx.bytes_per_parameter,
            "parameters": ctx.parameters,
        },
        None if expected else "rerun with --parameters N to compare the size with the plan",
    )


def single_job_baseline(results: Results, ctx: Context) -> Row:
    mean = per_job_label(results, "phase_mean", "phase")
    p50 = per_job_label(results, "phase_p50", "phase")
    worst = per_job_label(results, "phase_max", "phase")
    restore = per_job(results, "restore_duration_max")
    jobs: dict[str, JobVerdict] = {}
    for job in ctx.jobs:
        clocks = {
            phase: {
                "mean": mean.get(job, {}).get(phase),
                "p50": p50.get(job, {}).get(phase),
                "max": worst.get(job, {}).get(phase),
            }
            for phase in PHASES
        }
        values: dict[str, object] = {"phases": clocks, "restore_seconds_max": restore.get(job)}
        total = clocks["total"]["p50"] or clocks["total"]["mean"]
        if total is None:
            jobs[job] = JobVerdict(NOT_MEASURED, ("no finished save in the range",), values)
            continue
        deadline, _ = deadline_of(ctx, results, job)
        values["deadline"] = deadline
        missing = [p for p in ("pause", "staging", "write", "commit") if clocks[p]["mean"] is None]
        if restore.get(job) is None:
            missing.append("restore")
        notes = [
            "pause " + seconds(clocks["pause"]["mean"]),
            "staging " + seconds(clocks["staging"]["mean"]),
            "completion " + seconds(total),
            "restore " + seconds(restore.get(job)),
        ]
        if deadline is not None and total > deadline:
            reason = (
                f"the typical save (p50 {seconds(total)}) is over the {seconds(deadline)} deadline"
            )
            jobs[job] = JobVerdict(FAIL, (reason, *notes), values)
            continue
        if missing:
            notes.append(
                "not recorded: " + ", ".join(missing) + " (instrument the job with "
                "checkpoint_exporter.instrument; run restore-drill for the restore clock)"
            )
        jobs[job] = JobVerdict(PASS, tuple(notes), values)
    return Row(
        "single_job_baseline",
        "Single-job baseline",
        "Record pause, staging, write completion, commit and actual restore (four clocks).",
        combine(jobs),
        _summary(
            jobs,
            "the four clocks recorded, typical save within the deadline",
            "no finished save in the range",
        ),
        jobs,
    )


def concurrent_burst(results: Results, ctx: Context) -> Row:
    saves, within = per_job(results, "saves"), per_job(results, "within_deadline")
    misses, worst = (
        per_job(results, "deadline_misses"),
        per_job_label(results, "phase_max", "phase"),
    )
    peak = max(
        (
            s.value
            for s in results.get("peak_concurrent_jobs", ())
            if isinstance(s, Sample) and math.isfinite(s.value)
        ),
        default=0.0,
    )
    jobs: dict[str, JobVerdict] = {}
    for job in ctx.jobs:
        missed, ok = count(misses.get(job)), count(within.get(job))
        n = max(count(saves.get(job)), missed + ok)
        slowest = worst.get(job, {}).get("total")
        deadline, source = deadline_of(ctx, results, job)
        values = {
            "saves": n,
            "within_deadline": ok,
            "deadline_misses": missed,
            "worst_seconds": slowest,
            "deadline": deadline,
            "deadline_from": source,
        }
        if n == 0:
            jobs[job] = JobVerdict(NOT_MEASURED, ("no save finished in the range",), values)
        elif missed:
            jobs[job] = JobVerdict(
                FAIL,
                (
                    f"{missed} of {n} saves missed the {seconds(deadline)} deadline "
                    f"(worst {seconds(slowest)})",
                ),
                values,
            )
        elif deadline is not None and slowest is not None and slowest > deadline:
            jobs[job] = JobVerdict(
                FAIL,
                (
                    f"its slowest save took {seconds(slowest)}, over the agreed "
                    f"{seconds(deadline)} ({source})",
                ),
                values,
            )
        else:
            jobs[job] = JobVerdict(
                PASS, (f"{n} saves within {seconds(deadline)} (worst {seconds(slowest)})",), values
            )
    verdict, what = combine(jobs), None
    if verdict == PASS and peak < 2:
        # Every job met its deadline, but never while another one saved: no burst was tested.
        verdict = NOT_MEASURED
        what = (
            "no two jobs saved at once in the range: start every job's save together "
            "(a synchronized start), then rerun acceptance over that window"
        )
    summary = _summary(jobs, "every save within its own deadline", "no save finished")
    if verdict == NOT_MEASURED and what:
        summary = "every save met its deadline, but no two jobs saved at once"
    return Row(
        "concurrent_burst",
        "Concurrent burst",
        "Trigger the concurrent workload; every job meets its deadline; individual completion "
        "times, not aggregate GB/s.",
        verdict,
        summary,
        jobs,
        {"peak_concurrent_jobs": peak},
        what,
    )


def repeatability(results: Results, ctx: Context) -> Row:
    committed = per_job(results, "committed")
    backlog, flight = series_by(results, "backlog_range"), series_by(results, "in_progress_range")
    retained = series_by(results, "retained_range")
    retained_bytes = series_by(results, "retained_bytes_range")
    limits = per_job(results, "retention_limit")
    jobs: dict[str, JobVerdict] = {}
    for job in ctx.jobs:
        n = count(committed.get(job))
        values: dict[str, object] = {"saves_committed": n, "retention_limit": limits.get(job)}
        if n < MIN_SAVES_FOR_TREND:
            jobs[job] = JobVerdict(
                NOT_MEASURED,
                (
                    f"{n} saves committed in the range; a trend needs {MIN_SAVES_FOR_TREND}: "
                    "run longer",
                ),
                values,
            )
            continue
        reasons: list[str] = []
        for label, points, unit in (
            ("drain backlog", backlog.get(job, []), nbytes),
            ("in-flight saves", flight.get(job, []), str),
        ):
            split = thirds(points)
            if split is None:
                continue
            first, last = split
            values[label.replace(" ", "_").replace("-", "_") + "_floor"] = [min(first), min(last)]
            if min(last) > 0 and min(last) > min(first):
                reasons.append(
                    f"the {label} never drains: its floor rose from "
                    f"{unit(min(first))} to {unit(min(last))}"
                )
        split = thirds(retained.get(job, []))
        limit = limits.get(job)
        if split is not None:
            values["retained_generations_floor"] = min(split[1])
            if limit is not None and min(split[1]) > limit:
                reasons.append(
                    f"{min(split[1]):g} generations retained throughout the last "
                    f"third of the run, over the limit of {limit:g}"
                )
        rb = thirds(retained_bytes.get(job, []))
        if rb is not None:
            values["retained_bytes_first_last"] = [max(rb[0]), max(rb[1])]
        if reasons:
            jobs[job] = JobVerdict(FAIL, tuple(reasons), values)
        else:
            jobs[job] = JobVerdict(
                PASS,
                (f"{n} saves: backlog and in-flight saves drain, retention within its limit",),
                values,
            )
    memory: dict[str, object] = {}
    grew: list[str] = []
    for instance, points in series_by(results, "exporter_rss_range", "instance").items():
        split = thirds(points)
        if split is None:
            continue
        first_peak, last_floor = max(split[0]), min(split[1])
        memory[instance] = {"first_third_peak": first_peak, "last_third_floor": last_floor}
        if first_peak > 0 and last_floor > MEMORY_GROWTH * first_peak:
            grew.append(
                f"exporter {instance} grew from {nbytes(first_peak)} to "
                f"{nbytes(last_floor)} resident"
            )
    verdict = combine(jobs)
    summary = _summary(
        jobs,
        "no accumulating backlog, in-flight saves or retention leak",
        "too few saves in the range to show a trend",
    )
    if grew:
        verdict, summary = FAIL, "; ".join([*grew, *([summary] if combine(jobs) == FAIL else [])])
    return Row(
        "repeatability",
        "Repeatability",
        "Run successive intervals: no accumulating backlog, memory growth or retention leakage.",
        verdict,
        summary,
        jobs,
        {"exporter_resident_memory": memory, "memory_growth_limit": MEMORY_GROWTH},
        "run the jobs for at least three intervals inside the range"
        if verdict == NOT_MEASURED
        else None,
    )


def interrupted_save(results: Results, ctx: Context) -> Row:
    aborts = per_job(results, "aborts")
    valid = series_by(results, "valid_generations_range")
    valid_last = per_job(results, "valid_generations_last")
    newest_valid = per_job(results, "last_committed_valid")
    jobs: dict[str, JobVerdict] = {}
    for job in ctx.jobs:
        n = count(aborts.get(job))
        values: dict[str, object] = {
            "aborts": n,
            "valid_generations_at_end": valid_last.get(job),
            "newest_committed_valid": newest_valid.get(job),
        }
        points = valid.get(job, [])
        seen_valid = False
        dropped_at: float | None = None
        for t, v in points:
            if v > 0:
                seen_valid = True
            elif seen_valid and dropped_at is None:
                dropped_at = t
        if dropped_at is not None:
            values["no_valid_generation_at"] = dropped_at
            jobs[job] = JobVerdict(
                FAIL,
                (
                    f"no valid generation for {NO_RECOVERABLE_FOR // 60} minutes (the paging "
                    "alert's `for`): cleanup removed the last recoverable generation",
                ),
                values,
            )
        elif n == 0:
            jobs[job] = JobVerdict(NOT_MEASURED, ("no aborted save in the range",), values)
        elif (valid_last.get(job) or 0) < 1:
            jobs[job] = JobVerdict(
                FAIL, (f"{n} aborted save(s) and no committed, valid generation left",), values
            )
        else:
            jobs[job] = JobVerdict(
                PASS,
                (
                    f"{n} aborted save(s); {valid_last[job]:g} committed, valid generation(s) kept "
                    "throughout",
                ),
                values,
            )
    verdict = combine(jobs)
    return Row(
        "interrupted_save",
        "Interrupted save",
        "Stop a disposable job mid-checkpoint: recovery selects a complete generation; cleanup "
        "keeps the last recoverable one.",
        verdict,
        _summary(jobs, "the abort left a committed, valid generation", "no save was aborted"),
        jobs,
        what_to_run=None
        if verdict != NOT_MEASURED
        else (
            "kill a disposable test job (kill -9 one rank) during a save, let the next save "
            "commit, then rerun acceptance over that window"
        ),
    )


def recovery_drill(results: Results, ctx: Context) -> Row:
    restores, failures = per_job(results, "restores"), per_job(results, "restore_failures")
    durations, success = (
        per_job(results, "restore_duration_max"),
        per_job(results, "restore_last_success"),
    )
    jobs: dict[str, JobVerdict] = {}
    for job in ctx.jobs:
        n, failed = count(restores.get(job)), count(failures.get(job))
        values = {
            "restores": n,
            "failures": failed,
            "duration_max": durations.get(job),
            "last_success": success.get(job),
        }
        if failed:
            jobs[job] = JobVerdict(FAIL, (f"{failed} of {max(n, failed)} restores failed",), values)
        elif n:
            jobs[job] = JobVerdict(
                PASS, (f"{n} restore(s) succeeded (slowest {seconds(durations.get(job))})",), values
            )
        else:
            jobs[job] = JobVerdict(NOT_MEASURED, ("no restore in the range",), values)
    verdict = combine(jobs)
    config = ctx.config_file or "CONFIG"
    return Row(
        "recovery_drill",
        "Recovery drill",
        "Restore on the intended replacement allocation; an actual restore test.",
        verdict,
        _summary(jobs, "restores succeeded", "no restore ran in the range"),
        jobs,
        what_to_run=None
        if verdict != NOT_MEASURED
        else (
            f"checkpoint-exporter restore-drill --config.file {config} --job NAME --full "
            "on the replacement allocation, then rerun acceptance"
        ),
    )


OBJECTIVE_QUERIES = (
    ("interval", "interval"),
    ("deadline", "deadline"),
    ("retained_generations", "retention_limit"),
    ("restore_drill_max_age", "drill_max_age"),
    ("mtbf", "mtbf"),
)


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-6 * max(1.0, abs(a), abs(b))


def handover(results: Results, ctx: Context) -> Row:
    exported = {key: per_job(results, query) for key, query in OBJECTIVE_QUERIES}
    config = ctx.config_file or "CONFIG"
    jobs: dict[str, JobVerdict] = {}
    for job in ctx.jobs:
        thresholds = {key: exported[key].get(job) for key, _ in OBJECTIVE_QUERIES}
        agreed = ctx.objectives.get(job)
        values: dict[str, object] = {
            "exported_objectives": thresholds,
            "recovery_command": f"checkpoint-exporter restore-drill --config.file {config} "
            f"--job {job}",
        }
        reasons: list[str] = []
        if thresholds["interval"] is None or thresholds["deadline"] is None:
            reasons.append("no interval or deadline exported: the alerts have no threshold")
        if agreed is not None:
            values["agreed_objectives"] = {k: getattr(agreed, k) for k, _ in OBJECTIVE_QUERIES}
            values["agreed_from"] = agreed.source
            for key, _ in OBJECTIVE_QUERIES:
                want, have = getattr(agreed, key), thresholds[key]
                if want is not None and have is not None and not _close(want, have):
                    reasons.append(
                        f"the exporter enforces {key} {have:g}, the agreed objective "
                        f"({agreed.source}) is {want:g}: the alerts use the former"
                    )
        if reasons:
            jobs[job] = JobVerdict(FAIL, tuple(reasons), values)
        else:
            shown = ", ".join(
                f"{k} {seconds(v) if k != 'retained_generations' else f'{v:g}'}"
                for k, v in thresholds.items()
                if v is not None
            )
            jobs[job] = JobVerdict(PASS, (shown,), values)
    versions: dict[str, list[str]] = {}
    for sample in results.get("build_info", ()):
        if isinstance(sample, Sample):
            versions.setdefault(sample.label("version"), []).append(sample.label("instance"))
    sizes = {
        s.label("mountpoint"): s
        for s in results.get("filesystem_size", ())
        if isinstance(s, Sample)
    }
    avail = {
        s.label("mountpoint"): s.value
        for s in results.get("filesystem_avail", ())
        if isinstance(s, Sample)
    }
    filesystems = [
        {
            "mountpoint": mp,
            "device": s.label("device"),
            "fstype": s.label("fstype"),
            "size_bytes": s.value,
            "avail_bytes": avail.get(mp),
        }
        for mp, s in sorted(sizes.items())
    ]
    job_fs = sorted(
        (s.label("training_job"), s.label("tier"), s.label("mountpoint"))
        for s in results.get("job_filesystems", ())
        if isinstance(s, Sample)
    )
    nics = sorted(
        (s.label("instance"), s.label("device"), s.value)
        for s in results.get("nic_speed", ())
        if isinstance(s, Sample)
    )
    values = {
        "versions": versions,
        "filesystems": filesystems,
        "job_filesystems": [{"training_job": j, "tier": t, "mountpoint": m} for j, t, m in job_fs],
        "links": [{"instance": i, "device": d, "speed_bytes_per_second": v} for i, d, v in nics],
    }
    verdict = combine(jobs)
    summary = _summary(
        jobs,
        "thresholds, retention and recovery commands recorded",
        "no job exported its objectives",
    )
    if not versions:
        verdict, summary = FAIL, "no checkpoint_exporter_build_info in the range: versions unknown"
    elif verdict == PASS:
        summary += (
            f"; exporter versions {', '.join(sorted(versions))}; {len(filesystems)} "
            f"filesystems; {len(nics)} links" + ("" if nics else " (no node_exporter NIC series)")
        )
    return Row(
        "handover",
        "Handover",
        "Retain alert thresholds, retention policy, recovery commands, versions and the "
        "inventory of links and filesystems.",
        verdict,
        summary,
        jobs,
        values,
    )


def symptom_runbook(symptom: str) -> str:
    """The runbook section each exporter serves for a symptom (docs/runbooks.md)."""
    return f"/runbooks#symptom-{symptom}"


def symptoms(results: Results, ctx: Context) -> Row:
    """Informational: section 7's diagnosis of the range's saves. Not a section 8 checklist item,
    and over a long run some save will show one, so it never decides the exit status."""
    title = "Bottleneck symptoms (informational)"
    checklist = (
        "Not a checklist item: what held each save of the range back (staging-bound, "
        "straggler, contention, commit-bound, backlog, unrestorable, training disturbed), with "
        "the runbook section of each symptom. Never changes the exit status."
    )
    if not results.get("symptoms"):
        return Row(
            "symptoms",
            title,
            checklist,
            INFO,
            "this exporter exports no checkpoint_save_symptoms_total",
            what_to_run="upgrade the exporter to one with save diagnosis (symptom counters)",
        )
    found = per_job_label(results, "symptoms", "symptom")
    jobs: dict[str, JobVerdict] = {}
    for job in ctx.jobs:
        seen = {name: count(v) for name, v in sorted(found.get(job, {}).items()) if count(v)}
        values: dict[str, object] = {
            "symptoms": seen,
            "runbooks": {name: symptom_runbook(name) for name in seen},
        }
        if job not in found:
            reasons: tuple[str, ...] = ("no symptom series",)
        elif seen:
            reasons = tuple(
                f"{name} x{n} (runbook {symptom_runbook(name)})" for name, n in seen.items()
            )
        else:
            reasons = ("no save showed a symptom",)
        jobs[job] = JobVerdict(INFO, reasons, values)
    shown = [
        f"{job}: " + ", ".join(f"{name} x{n}" for name, n in verdict.values["symptoms"].items())
        for job, verdict in jobs.items()
        if verdict.values["symptoms"]
    ]
    return Row(
        "symptoms",
        title,
        checklist,
        INFO,
        "; ".join(shown) if shown else "no save in the range showed a symptom",
        jobs,
    )


def unmeasurable(key: str, title: str, checklist: str, what: str) -> Callable[..., Row]:
    def row(results: Results, ctx: Context) -> Row:
        return Row(
            key,
            title,
            checklist,
            NOT_MEASURED,
            "the metrics cannot judge this item",
            what_to_run=what,
        )

    return row


mixed_workload = unmeasurable(
    "mixed_workload",
    "Mixed workload",
    "Repeat with dataset reads and training communication active; record step-time impact.",
    "repeat the burst while the jobs train (dataset reads and collectives active), record the "
    "training step time beside the save windows, then rerun acceptance over that window",
)
degraded_path = unmeasurable(
    "degraded_path",
    "Degraded path",
    "Remove one storage path or endpoint in an approved window; verify the degraded deadline.",
    "in an approved window, take one storage-network path or endpoint out, run a save of every "
    "job, rerun acceptance with --objectives holding the degraded deadline, then restore "
    "redundancy",
)

# (key, the queries it reads, the row), in the checklist's order.
ROWS: tuple[tuple[str, tuple[str, ...], Callable[[Results, Context], Row]], ...] = (
    (
        "known_checkpoint",
        ("size_bytes", "files", "valid_min", "validation_failures", "node_written_bytes"),
        known_checkpoint,
    ),
    (
        "single_job_baseline",
        ("phase_mean", "phase_p50", "phase_max", "restore_duration_max", "deadline"),
        single_job_baseline,
    ),
    (
        "concurrent_burst",
        (
            "saves",
            "within_deadline",
            "deadline_misses",
            "phase_max",
            "deadline",
            "peak_concurrent_jobs",
        ),
        concurrent_burst,
    ),
    ("mixed_workload", (), mixed_workload),
    (
        "repeatability",
        (
            "committed",
            "backlog_range",
            "in_progress_range",
            "retained_range",
            "retained_bytes_range",
            "retention_limit",
            "exporter_rss_range",
        ),
        repeatability,
    ),
    ("degraded_path", (), degraded_path),
    (
        "interrupted_save",
        ("aborts", "valid_generations_range", "valid_generations_last", "last_committed_valid"),
        interrupted_save,
    ),
    (
        "recovery_drill",
        ("restores", "restore_failures", "restore_duration_max", "restore_last_success"),
        recovery_drill,
    ),
    (
        "handover",
        (
            "interval",
            "deadline",
            "retention_limit",
            "drill_max_age",
            "mtbf",
            "build_info",
            "filesystem_size",
            "filesystem_avail",
            "job_filesystems",
            "nic_speed",
        ),
        handover,
    ),
    ("symptoms", ("symptoms",), symptoms),
)


def overall(rows: Sequence[Row]) -> str:
    """The checklist's verdict: an informational row takes no part."""
    verdicts = {row.verdict for row in rows if row.verdict != INFO}
    if FAIL in verdicts:
        return FAIL
    return PASS if PASS in verdicts else NOT_MEASURED
