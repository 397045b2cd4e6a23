"""Every PromQL expression the acceptance report runs, by name.

Instant queries are evaluated at the end of the range and look back over the whole range
(``increase(x[R])``, ``last_over_time(x[R])``), so a range in the past is judged as it was.
Per-job series are reduced with ``max by (training_job)``, as the shipped recording rules do:
on a shared filesystem several exporters see the same job, and the largest view is the job's.

A gauge that describes the newest save or restore (``checkpoint_last_save_phase_seconds``,
``checkpoint_restore_last_duration_seconds``) still shows, after ``--from``, the last one
before it: its values are taken only while the event's counter stands above its value at
``--from`` (``@ start``), so a late save just before the range cannot fail a row of it.
"""

from __future__ import annotations

from dataclasses import dataclass

INSTANT, RANGE = "instant", "range"

# What the exporter's own network selection matches by default (config telemetry.network_devices):
# node_exporter's NIC series of those devices make the inventory of links.
NIC_DEVICES = "(eth|en|ib|mlx|bond).*"
TOTAL = 'phase="total"'
# The `for` of the paging alert CheckpointNoRecoverableGeneration (mixin/config.py ALERTS; the
# report does not import the mixin, a test holds the two equal): a job counts as having lost
# its last recoverable generation only when none was valid for this long, not on one sample
# (an exporter restarting reads 0 while its start-up validation runs).
NO_RECOVERABLE_FOR = 300
# How far apart the number of jobs saving at once is sampled, at most: a common scrape interval,
# so a save of a minute is seen however long the range (the range step of a day is 6 minutes).
# The cost is range / 15 s evaluations of one series per job and exporter.
CONCURRENCY_RESOLUTION = 15.0


@dataclass(frozen=True)
class Query:
    name: str
    expr: str
    kind: str = INSTANT


def _metric(name: str, selector: str, extra: str = "") -> str:
    matchers = ",".join(part for part in (selector, extra) if part)
    return f"{name}{{{matchers}}}"


def _after(counter: str, now: str, start: str, by: str = "") -> str:
    """True where ``now`` (the counter, or its minimum over a window) stands above the counter's
    value at ``start``: an event counted after the range began. A series that did not exist at
    the start (an exporter started in the range) counts whole. ``by``: reduce both sides first
    (``max by (training_job)``), for a counter another process exports."""
    before = f"{counter} @ {start}"
    if by:
        now, before = f"{by} ({now})", f"{by} ({before})"
    return f"({now} > {before} or {now} unless {before})"


def _newest_in_range(
    gauge: str,
    counter: str,
    step: str,
    start: str,
    match: str = "",
    by: str = "",
    over: str = "max_over_time",
) -> str:
    """The values a newest-event gauge took for events counted after ``start``: every sample of
    each ``step`` window whose first sample already counted one, so that the gauge shows only
    events of the range. The window that holds ``start`` is left out whole; an event in it is
    still seen in the next window unless a second one followed within the step."""
    on = f" {match}" if match else ""
    # A series present at the start is always in the first branch of _after, one that is not
    # always in the second: no label set comes from both, which `or` in a subquery refuses.
    return f"{over}({gauge}[{step}])\n  and{on} " + _after(
        counter, f"min_over_time({counter}[{step}])", start, by
    )


def build_queries(selector: str, start: float, end: float, step: float) -> dict[str, Query]:
    """``selector``: the matchers that find the exporters' series (as the mixin's, e.g.
    ``job="checkpoint-exporter"``); ``start``, ``end``: the range (unix seconds); ``step``: the
    range queries' and subqueries' resolution (seconds)."""

    def m(name: str, extra: str = "") -> str:
        return _metric(name, selector, extra)

    window = f"{max(1, round(end - start))}s"
    at = f"{start:.3f}"
    sub = f"{step:g}s"
    fine = f"{min(step, CONCURRENCY_RESOLUTION):g}s"

    def last(name: str, by: str = "training_job", extra: str = "") -> str:
        return f"max by ({by}) (last_over_time({m(name, extra)}[{window}]))"

    def inc(name: str, by: str = "training_job", extra: str = "") -> str:
        return f"max by ({by}) (increase({m(name, extra)}[{window}]))"

    duration = "checkpoint_save_duration_seconds"
    instant = {
        # known checkpoint
        "size_bytes": last("checkpoint_last_committed_size_bytes"),
        "files": last("checkpoint_last_committed_files"),
        # Whether a generation committed in the range failed validation (not one before it).
        "valid_min": "min by (training_job) (min_over_time((\n"
        + _newest_in_range(
            m("checkpoint_last_committed_valid"),
            m("checkpoint_saves_committed_total"),
            sub,
            at,
            "on (training_job)",
            "max by (training_job)",
            "min_over_time",
        )
        + f"\n)[{window}:{sub}]))",
        "validation_failures": inc("checkpoint_validation_failures_total", "training_job, reason"),
        "node_written_bytes": last(
            "checkpoint_last_save_disk_written_bytes", "training_job, instance"
        ),
        # single-job baseline: the four clocks
        "phase_mean": f"{inc(duration + '_sum', 'training_job, phase')}\n/\n"
        f"{inc(duration + '_count', 'training_job, phase')}",
        "phase_p50": "histogram_quantile(0.5, "
        f"{inc(duration + '_bucket', 'training_job, phase, le')})",
        # The newest committed save's phases, for saves committed in the range only. A node
        # exports its ranks' phases, the process reading the durable tier counts the commits
        # (one process or another, --scope): the commits are the job's, on training_job.
        "phase_max": "max by (training_job, phase) (max_over_time((\n"
        + _newest_in_range(
            m("checkpoint_last_save_phase_seconds"),
            m("checkpoint_saves_committed_total"),
            sub,
            at,
            "on (training_job)",
            "max by (training_job)",
        )
        + f"\n)[{window}:{sub}]))",
        "restore_duration_max": "max by (training_job) (max_over_time((\n"
        + _newest_in_range(
            m("checkpoint_restore_last_duration_seconds"), m("checkpoint_restores_total"), sub, at
        )
        + f"\n)[{window}:{sub}]))",
        # concurrent burst
        "saves": inc(duration + "_count", extra=TOTAL),
        "within_deadline": inc("checkpoint_saves_within_deadline_total"),
        "deadline_misses": inc("checkpoint_deadline_misses_total"),
        "committed": inc("checkpoint_saves_committed_total"),
        "peak_concurrent_jobs": f"max_over_time((count(max by (training_job) "
        f"({m('checkpoint_saves_in_progress')}) > 0))[{window}:{fine}])",
        # interrupted save
        "aborts": inc("checkpoint_saves_aborted_total"),
        "valid_generations_last": last("checkpoint_retained_valid_generations"),
        "last_committed_valid": f"min by (training_job) "
        f"(last_over_time({m('checkpoint_last_committed_valid')}[{window}]))",
        # recovery drill
        "restores": inc("checkpoint_restores_total"),
        "restore_failures": inc("checkpoint_restore_failures_total"),
        "restore_last_success": last("checkpoint_restore_last_success_timestamp_seconds"),
        # handover: the exported objectives, versions, inventory
        "interval": last("checkpoint_interval_seconds"),
        "deadline": last("checkpoint_deadline_seconds"),
        "retention_limit": last("checkpoint_retained_generations_limit"),
        "drill_max_age": last("checkpoint_restore_drill_max_age_seconds"),
        "mtbf": last("checkpoint_mtbf_seconds"),
        "build_info": last("checkpoint_exporter_build_info", "instance, version"),
        "filesystem_size": last("checkpoint_filesystem_size_bytes", "mountpoint, device, fstype"),
        "filesystem_avail": last("checkpoint_filesystem_avail_bytes", "mountpoint, device, fstype"),
        "job_filesystems": last("checkpoint_job_filesystem_info", "training_job, tier, mountpoint"),
        "nic_speed": f"max by (instance, device) (last_over_time("
        f'node_network_speed_bytes{{device=~"{NIC_DEVICES}"}}[{window}]))',
        # symptoms (issue 17 item 1), where the exporter has them
        "symptoms": inc("checkpoint_save_symptoms_total", "training_job, symptom"),
    }
    ranged = {
        "save_total_range": f"max by (training_job) "
        f"({m('checkpoint_last_save_phase_seconds', TOTAL)})",
        "backlog_range": f"max by (training_job) ({m('checkpoint_drain_backlog_bytes')})",
        "in_progress_range": f"max by (training_job) ({m('checkpoint_saves_in_progress')})",
        "retained_range": f"max by (training_job) ({m('checkpoint_retained_generations')})",
        "retained_bytes_range": f"max by (training_job) ({m('checkpoint_retained_bytes')})",
        # 0 only where no exporter saw a valid generation for the alert's whole `for`.
        "valid_generations_range": f"max by (training_job) (max_over_time("
        f"{m('checkpoint_retained_valid_generations')}[{NO_RECOVERABLE_FOR}s]))",
        "exporter_rss_range": f"max by (instance) ({m('process_resident_memory_bytes')})",
    }
    queries = {name: Query(name, expr) for name, expr in instant.items()}
    queries.update({name: Query(name, expr, RANGE) for name, expr in ranged.items()})
    return queries
