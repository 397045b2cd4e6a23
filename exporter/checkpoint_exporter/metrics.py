"""The only place metric names are spelled, and the bridge to prometheus_client.

Collectors (``checkpoint_exporter.collectors``) build families from these specs per scrape, out
of the current Snapshot; ``ExporterCollector`` wraps each one, as node_exporter does, with a
success and a duration series, so one broken source never fails the whole scrape.
"""

from __future__ import annotations

import logging
import platform
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import CollectorRegistry
from prometheus_client.utils import floatToGoString

from checkpoint_exporter import __version__
from checkpoint_exporter.errors import NoDataError
from checkpoint_exporter.model import HistogramState, Snapshot

log = logging.getLogger(__name__)

_FAMILIES = {
    "gauge": GaugeMetricFamily,
    "counter": CounterMetricFamily,
    "histogram": HistogramMetricFamily,
}


@dataclass(frozen=True)
class MetricSpec:
    name: str
    kind: str  # gauge | counter | histogram
    help: str
    labels: tuple[str, ...] = ()

    def family(self) -> Metric:
        return _FAMILIES[self.kind](self.name, self.help, labels=list(self.labels))

    def single(self, value: float) -> Metric:
        """A family holding one unlabelled sample."""
        family = self.family()
        family.add_metric([], value)
        return family


def add_histogram(family: Metric, labels: list[str], histogram: HistogramState) -> None:
    buckets = [(floatToGoString(bound), count) for bound, count in histogram.cumulative()]
    family.add_metric(labels, buckets, histogram.sum)


# --- the daemon itself ------------------------------------------------------------------------

BUILD_INFO = MetricSpec(
    "checkpoint_exporter_build_info",
    "gauge",
    "A metric with a constant '1' value labelled by the exporter's version.",
    ("version", "python_version"),
)
SCRAPE_COLLECTOR_SUCCESS = MetricSpec(
    "checkpoint_exporter_scrape_collector_success",
    "gauge",
    "1 if the collector produced data on this scrape; 0 if it failed or had no data.",
    ("collector",),
)
SCRAPE_COLLECTOR_DURATION = MetricSpec(
    "checkpoint_exporter_scrape_collector_duration_seconds",
    "gauge",
    "Time the collector took on this scrape.",
    ("collector",),
)

# --- per training job ----------------------------------------------------------------------

JOB_INFO = MetricSpec(
    "checkpoint_job_info",
    "gauge",
    "What is watched: one series per training job and storage tier.",
    ("training_job", "layout", "tier", "path"),
)
INTERVAL_SECONDS = MetricSpec(
    "checkpoint_interval_seconds",
    "gauge",
    "The job's checkpoint interval objective.",
    ("training_job",),
)
DEADLINE_SECONDS = MetricSpec(
    "checkpoint_deadline_seconds",
    "gauge",
    "The job's deadline from save start to durable commit.",
    ("training_job",),
)
RETAINED_GENERATIONS_LIMIT = MetricSpec(
    "checkpoint_retained_generations_limit",
    "gauge",
    "The job's configured retention: committed generations it should keep.",
    ("training_job",),
)
DEADLINE_BUCKET_INFO = MetricSpec(
    "checkpoint_deadline_bucket_info",
    "gauge",
    "The `le` of the save-duration bucket at the job's deadline (label `bucket`; promtool "
    "reserves `le` for histograms), for SLO rules to select that bucket.",
    ("training_job", "bucket"),
)
RESTORE_DRILL_MAX_AGE_SECONDS = MetricSpec(
    "checkpoint_restore_drill_max_age_seconds",
    "gauge",
    "Longest time allowed since the job's last successful restore drill.",
    ("training_job",),
)


# --- checkpoints on disk (durable tier) --------------------------------------------------------

_JOB = ("training_job",)
LAST_COMMITTED_TIMESTAMP = MetricSpec(
    "checkpoint_last_committed_timestamp_seconds",
    "gauge",
    "Commit time of the newest committed generation on the durable tier.",
    _JOB,
)
LAST_COMMITTED_STEP = MetricSpec(
    "checkpoint_last_committed_step",
    "gauge",
    "Training step of the newest committed generation, when the layout records it.",
    _JOB,
)
LAST_COMMITTED_SIZE = MetricSpec(
    "checkpoint_last_committed_size_bytes",
    "gauge",
    "Bytes in the newest committed generation.",
    _JOB,
)
LAST_COMMITTED_FILES = MetricSpec(
    "checkpoint_last_committed_files",
    "gauge",
    "Files in the newest committed generation.",
    _JOB,
)
LAST_COMMITTED_VALID = MetricSpec(
    "checkpoint_last_committed_valid",
    "gauge",
    "1 if the newest committed generation passed structural validation, 0 if it failed.",
    _JOB,
)
SAVES_IN_PROGRESS = MetricSpec(
    "checkpoint_saves_in_progress",
    "gauge",
    "Saves started and neither committed nor aborted.",
    _JOB,
)
OLDEST_SAVE_IN_PROGRESS_START = MetricSpec(
    "checkpoint_oldest_save_in_progress_start_timestamp_seconds",
    "gauge",
    "Start time of the oldest save in progress; 0 when none is.",
    _JOB,
)
LAST_SAVE_START = MetricSpec(
    "checkpoint_last_save_start_timestamp_seconds",
    "gauge",
    "Start time of the newest save, committed or not.",
    _JOB,
)
SAVES_COMMITTED = MetricSpec(
    "checkpoint_saves_committed_total",
    "counter",
    "Saves committed while the exporter ran.",
    _JOB,
)
SAVES_ABORTED = MetricSpec(
    "checkpoint_saves_aborted_total",
    "counter",
    "Saves abandoned while the exporter ran: no commit and no progress for the deadline.",
    _JOB,
)
DEADLINE_MISSES = MetricSpec(
    "checkpoint_deadline_misses_total",
    "counter",
    "Saves whose start-to-commit time exceeded the job's deadline.",
    _JOB,
)
SAVE_DURATION = MetricSpec(
    "checkpoint_save_duration_seconds",
    "histogram",
    "Duration of each phase of a save; the job's deadline is a bucket boundary.",
    ("training_job", "phase"),
)
LAST_SAVE_PHASE = MetricSpec(
    "checkpoint_last_save_phase_seconds",
    "gauge",
    "Duration of each phase of the newest committed save.",
    ("training_job", "phase"),
)
LAST_SAVE_WRITE_END = MetricSpec(
    "checkpoint_last_save_local_write_end_timestamp_seconds",
    "gauge",
    "When the newest save's last rank on this node finished writing (cross-node stragglers).",
    _JOB,
)
LAST_SAVE_WRITE_SPREAD = MetricSpec(
    "checkpoint_last_save_local_write_spread_seconds",
    "gauge",
    "Spread of the newest save's write ends across this node's ranks.",
    _JOB,
)
RETAINED_GENERATIONS = MetricSpec(
    "checkpoint_retained_generations",
    "gauge",
    "Committed generations on the durable tier.",
    _JOB,
)
RETAINED_BYTES = MetricSpec(
    "checkpoint_retained_bytes",
    "gauge",
    "Bytes held by committed generations on the durable tier.",
    _JOB,
)
RETAINED_VALID_GENERATIONS = MetricSpec(
    "checkpoint_retained_valid_generations",
    "gauge",
    "Committed generations on the durable tier that passed structural validation.",
    _JOB,
)
STORAGE_CLOCK_SKEW = MetricSpec(
    "checkpoint_storage_clock_skew_seconds",
    "gauge",
    "Newest file mtime minus this node's clock when the change was seen, the largest of the "
    "last 16 changes: positive when the storage's clock runs ahead; includes detection latency.",
    _JOB,
)
VALIDATION_FAILURES = MetricSpec(
    "checkpoint_validation_failures_total",
    "counter",
    "Committed generations found structurally broken, by reason.",
    ("training_job", "reason"),
)

# --- what this node did during the newest save's window ---------------------------------------

LAST_SAVE_NETWORK_TRANSMIT = MetricSpec(
    "checkpoint_last_save_network_transmit_bytes",
    "gauge",
    "Bytes sent on the selected NICs and InfiniBand ports during the newest save, this node.",
    _JOB,
)
LAST_SAVE_NETWORK_PEAK = MetricSpec(
    "checkpoint_last_save_network_peak_utilization_ratio",
    "gauge",
    "Highest transmit utilisation of any selected link during the newest save, this node.",
    _JOB,
)
LAST_SAVE_DISK_WRITTEN = MetricSpec(
    "checkpoint_last_save_disk_written_bytes",
    "gauge",
    "Bytes written to the block devices behind the job's paths during the newest save.",
    _JOB,
)
LAST_SAVE_GPU_UTILIZATION = MetricSpec(
    "checkpoint_last_save_gpu_utilization_ratio",
    "gauge",
    "Mean GPU utilisation of this node during the newest save.",
    _JOB,
)
LAST_SAVE_GPU_BASELINE = MetricSpec(
    "checkpoint_last_save_gpu_baseline_utilization_ratio",
    "gauge",
    "Mean GPU utilisation of this node in an equal window just before the newest save.",
    _JOB,
)

# --- capacity ------------------------------------------------------------------------------

_FS = ("mountpoint", "device", "fstype")
FILESYSTEM_SIZE = MetricSpec(
    "checkpoint_filesystem_size_bytes", "gauge", "Size of a filesystem behind a watched path.", _FS
)
FILESYSTEM_AVAIL = MetricSpec(
    "checkpoint_filesystem_avail_bytes",
    "gauge",
    "Bytes available to non-root users on a filesystem behind a watched path.",
    _FS,
)
FILESYSTEM_RESERVE = MetricSpec(
    "checkpoint_filesystem_reserve_ratio",
    "gauge",
    "Share of the filesystem to keep free: the largest capacity_reserve of the jobs on it.",
    _FS,
)
FILESYSTEM_DEVICE_ERROR = MetricSpec(
    "checkpoint_filesystem_device_error",
    "gauge",
    "1 when statvfs on the filesystem failed or did not answer within its time budget "
    "(size and avail then hold the last values read).",
    _FS,
)
JOB_FILESYSTEM_INFO = MetricSpec(
    "checkpoint_job_filesystem_info",
    "gauge",
    "Which filesystem each job's tier lives on.",
    ("training_job", "tier", "mountpoint"),
)

# --- drain (staging tier -> durable tier) -------------------------------------------------------

DRAIN_BACKLOG_BYTES = MetricSpec(
    "checkpoint_drain_backlog_bytes",
    "gauge",
    "Bytes committed on the staging tier and not yet committed on the durable tier.",
    _JOB,
)
DRAIN_BACKLOG_GENERATIONS = MetricSpec(
    "checkpoint_drain_backlog_generations",
    "gauge",
    "Generations committed on the staging tier and not yet committed on the durable tier.",
    _JOB,
)
OLDEST_UNDRAINED_COMMIT = MetricSpec(
    "checkpoint_oldest_undrained_commit_timestamp_seconds",
    "gauge",
    "Staging commit time of the oldest generation not yet drained; 0 when none waits.",
    _JOB,
)
STAGED_BYTES = MetricSpec(
    "checkpoint_staged_bytes_total",
    "counter",
    "Bytes committed on the staging tier (arrival rate).",
    _JOB,
)
DRAINED_BYTES = MetricSpec(
    "checkpoint_drained_bytes_total",
    "counter",
    "Bytes of staged generations committed on the durable tier (drain rate).",
    _JOB,
)
DRAIN_LOST = MetricSpec(
    "checkpoint_drain_lost_generations_total",
    "counter",
    "Staged generations deleted before their durable copy committed.",
    _JOB,
)

# --- restores --------------------------------------------------------------------------------

RESTORE_LAST_SUCCESS = MetricSpec(
    "checkpoint_restore_last_success_timestamp_seconds",
    "gauge",
    "When a restore (drill or training job) last succeeded.",
    _JOB,
)
RESTORE_LAST_DURATION = MetricSpec(
    "checkpoint_restore_last_duration_seconds",
    "gauge",
    "Duration of the newest finished restore, successful or not.",
    _JOB,
)
RESTORES = MetricSpec(
    "checkpoint_restores_total",
    "counter",
    "Restores finished while the exporter ran, successful or not.",
    _JOB,
)
RESTORE_FAILURES = MetricSpec(
    "checkpoint_restore_failures_total",
    "counter",
    "Restores that failed while the exporter ran.",
    _JOB,
)

# --- the daemon's own work ---------------------------------------------------------------------

WATCH_INFO = MetricSpec(
    "checkpoint_exporter_watch_info",
    "gauge",
    "How each watched path is followed: inotify or poll.",
    ("training_job", "tier", "mode"),
)
SCAN_DURATION = MetricSpec(
    "checkpoint_exporter_scan_duration_seconds",
    "histogram",
    "Time to rescan one job.",
)
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
    "before_start, open_saves_cap, open_restores_cap, ranks_cap.",
    ("reason",),
)
SPOOL_DROPPED_BYTES = MetricSpec(
    "checkpoint_exporter_spool_dropped_bytes_total",
    "counter",
    "Spool bytes never parsed, by reason: unknown_job (a directory of a job not watched "
    "here), backlog (skipped ahead of a file too far behind).",
    ("reason",),
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
READY = MetricSpec(
    "checkpoint_exporter_ready",
    "gauge",
    "1 once every watched tier has had its first full pass; until then the job series are partial.",
)
FIRST_SCAN_DONE = MetricSpec(
    "checkpoint_exporter_first_scan_done",
    "gauge",
    "1 once the tier's first full pass finished.",
    ("training_job", "tier"),
)
FIRST_SCAN_ENTRIES = MetricSpec(
    "checkpoint_exporter_first_scan_entries",
    "gauge",
    "Directory entries read so far by the tier's first full pass (its progress).",
    ("training_job", "tier"),
)
MOUNT_STUCK = MetricSpec(
    "checkpoint_exporter_mount_stuck",
    "gauge",
    "1 while a filesystem operation on the mount has run past its time budget (a hung mount); "
    "the jobs on it are not updated meanwhile, every other job is.",
    ("mountpoint",),
)
LAST_SCAN_SUCCESS = MetricSpec(
    "checkpoint_exporter_last_scan_success_timestamp_seconds",
    "gauge",
    "When the tier's view was last confirmed current: a pass, or for a watched tier a probe of "
    "its mount. time() minus this is the age of the job's series.",
    ("training_job", "tier"),
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
DISCOVER_EXCESS = MetricSpec(
    "checkpoint_exporter_discover_excess_jobs",
    "gauge",
    "Subdirectories of a discover root over its max_jobs, not watched.",
    ("root",),
)

ALL: tuple[MetricSpec, ...] = (
    BUILD_INFO,
    SCRAPE_COLLECTOR_SUCCESS,
    SCRAPE_COLLECTOR_DURATION,
    JOB_INFO,
    INTERVAL_SECONDS,
    DEADLINE_SECONDS,
    RETAINED_GENERATIONS_LIMIT,
    DEADLINE_BUCKET_INFO,
    RESTORE_DRILL_MAX_AGE_SECONDS,
    LAST_COMMITTED_TIMESTAMP,
    LAST_COMMITTED_STEP,
    LAST_COMMITTED_SIZE,
    LAST_COMMITTED_FILES,
    LAST_COMMITTED_VALID,
    SAVES_IN_PROGRESS,
    OLDEST_SAVE_IN_PROGRESS_START,
    LAST_SAVE_START,
    SAVES_COMMITTED,
    SAVES_ABORTED,
    DEADLINE_MISSES,
    SAVE_DURATION,
    LAST_SAVE_PHASE,
    LAST_SAVE_WRITE_END,
    LAST_SAVE_WRITE_SPREAD,
    RETAINED_GENERATIONS,
    RETAINED_BYTES,
    RETAINED_VALID_GENERATIONS,
    STORAGE_CLOCK_SKEW,
    VALIDATION_FAILURES,
    LAST_SAVE_NETWORK_TRANSMIT,
    LAST_SAVE_NETWORK_PEAK,
    LAST_SAVE_DISK_WRITTEN,
    LAST_SAVE_GPU_UTILIZATION,
    LAST_SAVE_GPU_BASELINE,
    FILESYSTEM_SIZE,
    FILESYSTEM_AVAIL,
    FILESYSTEM_RESERVE,
    FILESYSTEM_DEVICE_ERROR,
    JOB_FILESYSTEM_INFO,
    DRAIN_BACKLOG_BYTES,
    DRAIN_BACKLOG_GENERATIONS,
    OLDEST_UNDRAINED_COMMIT,
    STAGED_BYTES,
    DRAINED_BYTES,
    DRAIN_LOST,
    RESTORE_LAST_SUCCESS,
    RESTORE_LAST_DURATION,
    RESTORES,
    RESTORE_FAILURES,
    WATCH_INFO,
    SCAN_DURATION,
    SCAN_OPERATIONS,
    SCAN_ERRORS,
    WATCH_OVERFLOWS,
    SPOOL_EVENTS,
    SPOOL_INVALID,
    SPOOL_DROPPED,
    SPOOL_DROPPED_BYTES,
    SPOOL_BACKLOG,
    SPOOL_POLL_SECONDS,
    READY,
    FIRST_SCAN_DONE,
    FIRST_SCAN_ENTRIES,
    MOUNT_STUCK,
    LAST_SCAN_SUCCESS,
    CONFIG_RELOAD_SUCCESSFUL,
    CONFIG_RELOAD_SUCCESS_TIME,
    DISCOVER_EXCESS,
)


class SnapshotCollector:
    """The small interface every collector implements: metric families from one Snapshot."""

    name: str = ""
    # Its samples for a job depend only on that job (and on which telemetry sources have data),
    # so exposition.Renderer may ask for one job at a time and keep unchanged jobs' lines.
    per_job: bool = False

    def collect(self, snapshot: Snapshot) -> Iterable[Metric]:
        raise NotImplementedError


class ExporterCollector:
    """A prometheus_client collector that runs every enabled SnapshotCollector per scrape."""

    def __init__(
        self, snapshot: Callable[[], Snapshot], collectors: Sequence[SnapshotCollector]
    ) -> None:
        self._snapshot = snapshot
        self._collectors = tuple(collectors)

    def collect(self) -> Iterator[Metric]:
        snapshot = self._snapshot()
        build = BUILD_INFO.family()
        build.add_metric([__version__, platform.python_version()], 1)
        yield build
        success = SCRAPE_COLLECTOR_SUCCESS.family()
        duration = SCRAPE_COLLECTOR_DURATION.family()
        for collector in self._collectors:
            started = time.perf_counter()
            try:
                families = list(collector.collect(snapshot))
                ok = 1
            except NoDataError as reason:
                families, ok = [], 0
                log.debug(
                    "collector returned no data: collector=%s reason=%s", collector.name, reason
                )
            except Exception:
                families, ok = [], 0
                log.exception("collector failed: collector=%s", collector.name)
            duration.add_metric([collector.name], time.perf_counter() - started)
            success.add_metric([collector.name], ok)
            yield from families
        yield success
        yield duration


def build_registry(
    snapshot: Callable[[], Snapshot],
    collectors: Sequence[SnapshotCollector],
    runtime_metrics: bool = False,
) -> CollectorRegistry:
    """A fresh registry; the process/platform/gc collectors only when asked for."""
    registry = CollectorRegistry()
    registry.register(ExporterCollector(snapshot, collectors))
    if runtime_metrics:
        from prometheus_client import GCCollector, PlatformCollector, ProcessCollector

        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        GCCollector(registry=registry)
    return registry


def reference_table() -> str:
    """The Markdown table of every metric, for docs/metrics.md."""
    rows = ["| name | type | labels | meaning |", "|---|---|---|---|"]
    for spec in ALL:
        labels = ", ".join(f"`{label}`" for label in spec.labels) or "—"
        rows.append(f"| `{spec.name}` | {spec.kind} | {labels} | {spec.help} |")
    return "\n".join(rows) + "\n"
