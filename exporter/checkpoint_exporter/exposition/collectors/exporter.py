"""The exporter's own work and health: scans, the spool, watches, readiness, stuck mounts, the
age of each tier's view, configuration reloads."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import Metric

from checkpoint_exporter.exposition.collectors.base import (
    MetricSpec,
    SnapshotCollector,
    add_histogram,
    by_label,
)
from checkpoint_exporter.model import Snapshot

_TIER = ("training_job", "tier")
SCAN_OPERATIONS = MetricSpec(
    "checkpoint_exporter_scan_metadata_operations_total",
    "counter",
    "stat, listdir and open calls made on watched paths.",
)
SCAN_ERRORS = MetricSpec(
    "checkpoint_exporter_scan_errors_total",
    "counter",
    "Paths that could not be read during scans (permission denied, I/O errors).",
)
WATCH_OVERFLOWS = MetricSpec(
    "checkpoint_exporter_watch_overflows_total",
    "counter",
    "inotify queue overflows; each one triggers a full reconcile.",
)
SCAN_DURATION = MetricSpec(
    "checkpoint_exporter_scan_duration_seconds",
    "histogram",
    "Time to rescan one job.",
)
SPOOL_EVENTS = MetricSpec(
    "checkpoint_exporter_spool_events_total",
    "counter",
    "Valid events read from the spool, by event.",
    ("event",),
)
SPOOL_INVALID = MetricSpec(
    "checkpoint_exporter_spool_invalid_lines_total",
    "counter",
    "Spool lines skipped, by reason: not_json, schema, unknown_event, too_long.",
    ("reason",),
)
SPOOL_DROPPED = MetricSpec(
    "checkpoint_exporter_spool_dropped_total",
    "counter",
    "Spool events refused or saves and restores given up, by reason: future, past, "
    "not_drill, before_start, open_saves_cap, open_restores_cap, ranks_cap.",
    ("reason",),
)
SPOOL_DROPPED_BYTES = MetricSpec(
    "checkpoint_exporter_spool_dropped_bytes_total",
    "counter",
    "Spool bytes never parsed, by reason: unknown_job (a directory of a job not watched "
    "here), backlog (skipped ahead of a file too far behind), owner (a directory or file of a "
    "user who is not the job's).",
    ("reason",),
)
SPOOL_SQUATTED = MetricSpec(
    "checkpoint_exporter_spool_squatted",
    "gauge",
    "Spool directories of the job not read because another user owns them (made before the "
    "job's own, or contested); only while there are some. The log line names each, its owner "
    "and the job's.",
    ("training_job",),
)
SPOOL_BACKLOG = MetricSpec(
    "checkpoint_exporter_spool_backlog_bytes",
    "gauge",
    "Bytes of the followed spool files not read yet (a poll reads within a budget).",
)
SPOOL_POLL_SECONDS = MetricSpec(
    "checkpoint_exporter_spool_poll_seconds_total",
    "counter",
    "Time spent listing and reading the spool (rate() is the share of a core it costs).",
)
DISCOVER_EXCESS = MetricSpec(
    "checkpoint_exporter_discover_excess_jobs",
    "gauge",
    "Subdirectories of a discover root over its max_jobs, not watched.",
    ("root",),
)
DISCOVER_ROOT_MISSING = MetricSpec(
    "checkpoint_exporter_discover_root_missing",
    "gauge",
    "1 while a discover root does not exist (not yet, or no longer): listed from when it appears.",
    ("root",),
)
SPOOL_WRITABLE = MetricSpec(
    "checkpoint_exporter_spool_writable",
    "gauge",
    "1 when the event spool exists and training jobs of any user can make their directory in "
    "it (mode 1733, or 1773 for a shared group); 0 and the clocks of instrumented jobs are "
    "lost (only where this process reads the spool: --scope=node).",
)
READY = MetricSpec(
    "checkpoint_exporter_ready",
    "gauge",
    "1 once every watched tier has had its first full pass; until then the job series are partial.",
)
FIRST_SCAN_DONE = MetricSpec(
    "checkpoint_exporter_first_scan_done",
    "gauge",
    "0 while the tier's first full pass runs; the series goes once the pass has finished "
    "(so == 0 names the tiers still being read, and a thousand ready jobs add no lines).",
    _TIER,
)
FIRST_SCAN_ENTRIES = MetricSpec(
    "checkpoint_exporter_first_scan_entries",
    "gauge",
    "Directory entries read so far by the tier's first full pass (its progress), while it runs.",
    _TIER,
)
LAST_SCAN_SUCCESS = MetricSpec(
    "checkpoint_exporter_last_scan_timestamp_seconds",
    "gauge",
    "When the tier's view was last confirmed current: a pass, or for a watched tier a probe of "
    "its mount. time() minus this is the age of the job's series.",
    _TIER,
)
MOUNT_STUCK = MetricSpec(
    "checkpoint_exporter_mount_stuck",
    "gauge",
    "1 while a filesystem operation on the mount has run past its time budget (a hung mount); "
    "the jobs on it are not updated meanwhile, every other job is.",
    ("mountpoint",),
)
WORKER_TASK_FAILURES = MetricSpec(
    "checkpoint_exporter_worker_task_failures_total",
    "counter",
    "Tasks of the mount's worker (a read, a placement, a listing, a probe) that raised instead "
    "of handing back a value: a bug, logged with the task; reads and listings are tried again.",
    ("mountpoint",),
)
CONFIG_RELOAD_SUCCESSFUL = MetricSpec(
    "checkpoint_exporter_config_last_reload_successful",
    "gauge",
    "1 if the last configuration load (start or SIGHUP) succeeded.",
)
CONFIG_RELOAD_SUCCESS_TIME = MetricSpec(
    "checkpoint_exporter_config_last_reload_success_timestamp_seconds",
    "gauge",
    "When the configuration was last loaded successfully.",
)
SHARD_INFO = MetricSpec(
    "checkpoint_exporter_shard_info",
    "gauge",
    "What this process serves, when told (--scope, --shard): its scopes (node, shared or "
    "node,shared) and its shard of the jobs by Prometheus' hashmod of the job name. Absent for "
    "the default, one process serving everything.",
    ("shard", "shards", "scope"),
)


class DaemonCollector(SnapshotCollector):
    name = "exporter"
    specs = (
        SCAN_OPERATIONS, SCAN_ERRORS, WATCH_OVERFLOWS, SCAN_DURATION, SPOOL_EVENTS, SPOOL_INVALID,
        SPOOL_DROPPED, SPOOL_DROPPED_BYTES, SPOOL_SQUATTED, SPOOL_BACKLOG, SPOOL_POLL_SECONDS,
        DISCOVER_EXCESS, DISCOVER_ROOT_MISSING, SPOOL_WRITABLE, READY, FIRST_SCAN_DONE,
        FIRST_SCAN_ENTRIES, LAST_SCAN_SUCCESS, MOUNT_STUCK, WORKER_TASK_FAILURES,
        CONFIG_RELOAD_SUCCESSFUL, CONFIG_RELOAD_SUCCESS_TIME, SHARD_INFO,
    )  # fmt: skip

    def collect(self, snapshot: Snapshot) -> Iterable[Metric]:
        daemon = snapshot.daemon
        out = [
            SCAN_OPERATIONS.single(daemon.metadata_operations),
            SCAN_ERRORS.single(daemon.scan_errors),
            WATCH_OVERFLOWS.single(daemon.watch_overflows),
        ]
        if daemon.scans is not None:
            scans = SCAN_DURATION.family()
            add_histogram(scans, [], daemon.scans)
            out.append(scans)
        out += [
            by_label(SPOOL_EVENTS, daemon.spool_events),
            by_label(SPOOL_INVALID, daemon.spool_invalid),
            by_label(SPOOL_DROPPED, daemon.spool_dropped),
            by_label(SPOOL_DROPPED_BYTES, daemon.spool_dropped_bytes),
            by_label(SPOOL_SQUATTED, daemon.spool_squatted),
            SPOOL_BACKLOG.single(daemon.spool_backlog_bytes),
            SPOOL_POLL_SECONDS.single(daemon.spool_poll_seconds),
            by_label(DISCOVER_EXCESS, daemon.discover_excess),
            by_label(DISCOVER_ROOT_MISSING, daemon.discover_missing),
            READY.single(1 if daemon.ready else 0),
        ]
        if daemon.spool_writable is not None:
            out.append(SPOOL_WRITABLE.single(1 if daemon.spool_writable else 0))
        done, entries = FIRST_SCAN_DONE.family(), FIRST_SCAN_ENTRIES.family()
        for job, tier, finished, read in daemon.first_scans:
            if not finished:  # progress while it is made; afterwards only cost on every scrape
                done.add_metric([job, tier], 0)
                entries.add_metric([job, tier], read)
        success = LAST_SCAN_SUCCESS.family()
        for job, tier, when in daemon.scan_success:
            success.add_metric([job, tier], when)
        stuck = MOUNT_STUCK.family()
        for mountpoint, is_stuck in daemon.mounts:
            stuck.add_metric([mountpoint], 1 if is_stuck else 0)
        out += [
            done,
            entries,
            success,
            stuck,
            by_label(WORKER_TASK_FAILURES, daemon.worker_task_failures),
            CONFIG_RELOAD_SUCCESSFUL.single(1 if daemon.config_reload_successful else 0),
        ]
        if daemon.config_reload_success_time:
            out.append(CONFIG_RELOAD_SUCCESS_TIME.single(daemon.config_reload_success_time))
        if daemon.shard_info is not None:
            shard, shards, scope = daemon.shard_info
            info = SHARD_INFO.family()
            info.add_metric([str(shard), str(shards), scope], 1)
            out.append(info)
        return out
