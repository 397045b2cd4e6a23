"""The reference snapshot: every metric family the exporter can export, in one fixed state.

``make generate`` renders it through the scrape's own path (``Renderer`` with every collector
on, the encoders ``/metrics`` picks for each Accept header) into tests/exposition/golden/, and
tests/exposition/test_golden.py fails when a metric's name, help, type, labels or value
formatting changes: the golden files are what a scrape looks like, a page to read beside
docs/metrics.md, and the proof that a restructure changed no byte (node_exporter keeps its
e2e-output file for the same reasons).

It lives in the package, not in tests/, because ``python -m checkpoint_exporter.mixin.generate
--check`` (which the suite runs) must rebuild the golden files like every other generated file,
and package code never imports tests.

The states are hand-built, not taken from a tracker: what a family looks like must not move
when the core's bookkeeping does. Every time is an offset from ``NOW``; nothing reads a clock.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from prometheus_client.exposition import choose_encoder

from checkpoint_exporter.exposition.collectors import REGISTRY, enabled_collectors
from checkpoint_exporter.exposition.renderer import Renderer
from checkpoint_exporter.model import (
    ABORTED,
    COMMITTED,
    DELETING,
    DURABLE,
    STAGING,
    WRITING,
    DaemonState,
    FilesystemState,
    Generation,
    HistogramState,
    JobState,
    ObjectStoreUsage,
    RestoreRecord,
    SaveRecord,
    Snapshot,
    WatchedPath,
    WindowTelemetry,
)

NOW = 1_767_225_600.0  # 2026-01-01T00:00:00Z, the snapshot's instant
GIB = 1 << 30
TRUNCATED = "truncated_shard"  # a validation reason (sources/validate.py REASONS)
# The tracker's save-duration bounds (core/tracker.py DURATION_BUCKETS, to which it adds the job's
# deadline), spelt out: the exposition may not import the core.
_DURATION_BOUNDS = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
_SCAN_BOUNDS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 120.0)

# The Accept header a scraper sends, by golden file suffix: the two formats /metrics serves.
FORMATS = {
    "prom": "text/plain; version=0.0.4",
    "openmetrics": "application/openmetrics-text; version=1.0.0",
}


def _saves(deadline: float, *counts: int, total: float) -> HistogramState:
    """A job's save durations, in the buckets the tracker gives a job with ``deadline``."""
    return HistogramState(tuple(sorted({*_DURATION_BOUNDS, deadline})), counts, total)


def _gen(
    gen_id: str, tier: str, state: str, step: int, ago: float, took: float | None, size: int,
    files: int, valid: bool | None = None, reason: str | None = None,
) -> Generation:  # fmt: skip
    """A generation started ``ago`` seconds before NOW, committed ``took`` seconds later (None:
    never committed), last written 30 s after it started when it never was."""
    start = NOW - ago
    commit = None if took is None else start + took
    end = start + 30 if commit is None else commit
    return Generation(gen_id, tier, step, state, start, end, commit, size, files, valid, reason)


def _two_tiers() -> JobState:
    """Saves to node-local NVMe, drained to Lustre: the newest generation staged, not yet
    durable. Instrumented (spool events from this node's ranks), with window telemetry; its last
    restore drill passed, an earlier one failed."""
    name = "llama-70b"
    return JobState(
        name=name,
        layout="dcp",
        paths=(
            WatchedPath(STAGING, f"/nvme/ckpt/{name}", "inotify", "/nvme"),
            WatchedPath(DURABLE, f"/lustre/ckpt/{name}", "poll", "/lustre"),
        ),
        interval_seconds=1800.0,
        deadline_seconds=450.0,
        retained_generations_limit=3,
        restore_drill_max_age_seconds=604800.0,
        mtbf_seconds=43200.0,
        first_seen=NOW - 86400,
        alive_at=NOW - 5,
        heartbeat_at=NOW - 5.5,
        generations=(
            _gen("step_2000", DURABLE, COMMITTED, 2000, 5400, 300, 140 * GIB, 513, True),
            _gen("step_3000", DURABLE, COMMITTED, 3000, 3600, 360, 140 * GIB, 513, True),
            _gen("step_3000", STAGING, COMMITTED, 3000, 3600, 30, 140 * GIB, 513),
            _gen("step_4000", STAGING, COMMITTED, 4000, 1800, 27.5, 140 * GIB, 513),
        ),
        saves_committed=12,
        deadline_misses=1,
        saves_within_deadline=11,
        save_duration=(
            ("commit", _saves(450, 9, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, total=31.25)),
            ("pause", _saves(450, 10, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, total=9.5)),
            ("staging", _saves(450, 0, 0, 8, 4, 0, 0, 0, 0, 0, 0, 0, 0, total=243.0)),
            ("total", _saves(450, 0, 0, 0, 0, 0, 2, 5, 4, 1, 0, 0, 0, total=3541.75)),
            ("write", _saves(450, 0, 0, 0, 0, 0, 3, 6, 2, 1, 0, 0, 0, total=3022.0)),
        ),
        last_phases=(
            ("commit", 2.5),
            ("pause", 0.75),
            ("staging", 24.25),
            ("total", 327.5),
            ("write", 300.0),
        ),
        last_save_symptoms=("staging_bound",),
        save_symptoms=(("backlog", 1), ("staging_bound", 4)),
        saves_timed=True,
        last_write_end=NOW - 1773.25,
        last_write_step=4000,
        last_write_spread=1.125,
        restores=3,
        restore_failures=1,
        restore_drills=2,
        restore_drill_failures=1,
        restore_last_success=NOW - 7200,
        restore_last_duration=412.5,
        window=WindowTelemetry(
            start=NOW - 1800,
            end=NOW - 1772.5,
            network_transmit_bytes=150323855360.0,
            network_peak_utilization=0.8125,
            disk_written_bytes=150323855360.0,
            gpu_utilization=0.125,
            gpu_baseline_utilization=0.96875,
        ),
        drain_backlog_bytes=140 * GIB,
        drain_backlog_generations=1,
        oldest_undrained_commit=NOW - 1772.5,
        staged_bytes=12 * 140 * GIB,
        drained_bytes=11 * 140 * GIB,
        lost_generations=0,
        recent_saves=(
            SaveRecord(
                4000, NOW - 1800, NOW - 1772.5, (("total", 27.5),), "ok", ("staging_bound",)
            ),
        ),
        recent_restores=(
            RestoreRecord(NOW - 50000, False, 3.0, "missing_shard", drill=True),
            RestoreRecord(NOW - 7200, True, 412.5, drill=True),
        ),
        storage_clock_skew=-0.25,
        last_committed_valid=True,
        version=7,
    )


def _saving() -> JobState:
    """A save under way on a single tier: one generation still being written, another whose
    retention is deleting it, and a squatted spool directory (DaemonState)."""
    name = "gpt-13b"
    return JobState(
        name=name,
        layout="hf",
        paths=(WatchedPath(DURABLE, f"/lustre/ckpt/{name}", "inotify", "/lustre"),),
        interval_seconds=900.0,
        deadline_seconds=120.0,
        retained_generations_limit=2,
        restore_drill_max_age_seconds=86400.0,
        first_seen=NOW - 172800,
        alive_at=NOW - 1,
        heartbeat_at=NOW - 30,
        generations=(
            _gen("checkpoint-1000", DURABLE, DELETING, 1000, 2700, 55, 26 * GIB, 9, True),
            _gen("checkpoint-1100", DURABLE, COMMITTED, 1100, 1800, 55, 26 * GIB, 9, True),
            _gen("checkpoint-1200", DURABLE, WRITING, 1200, 42, None, 11 * GIB, 4),
        ),
        saves_committed=40,
        saves_within_deadline=40,
        save_duration=(("total", _saves(120, 0, 0, 0, 12, 28, 0, 0, 0, 0, 0, 0, total=1921.0)),),
        saves_timed=True,
        local_saves_in_progress=1,
        last_write_end=NOW - 1746,
        last_write_step=1100,
        storage_clock_skew=2.0,
        last_committed_valid=True,
        version=3,
    )


def _broken() -> JobState:
    """A save that was aborted, and a newest commit that failed validation (a truncated shard)
    after a restore of it failed; the earlier restore passed."""
    name = "bert-large"
    return JobState(
        name=name,
        layout="torchsave",
        paths=(WatchedPath(DURABLE, f"/lustre/ckpt/{name}", "inotify", "/lustre"),),
        interval_seconds=3600.0,
        deadline_seconds=300.0,
        retained_generations_limit=5,
        restore_drill_max_age_seconds=604800.0,
        paging=False,
        first_seen=NOW - 3600,
        alive_at=NOW - 60,
        generations=(
            _gen("epoch_7.pt", DURABLE, COMMITTED, 7000, 7300, 100, 3 * GIB, 1, True),
            _gen("epoch_8.pt", DURABLE, COMMITTED, 8000, 3700, 100, 2 * GIB, 1, False, TRUNCATED),
            _gen("epoch_9.pt.tmp", DURABLE, ABORTED, 9000, 600, None, GIB, 1),
        ),
        saves_committed=2,
        saves_aborted=1,
        deadline_misses=1,
        saves_within_deadline=1,
        validation_failures=((TRUNCATED, 1),),
        last_phases=(),  # not instrumented: the disk's own total is exported
        last_save_symptoms=("unrestorable",),
        save_symptoms=(("unrestorable", 1),),
        restores=2,
        restore_failures=1,
        restore_last_success=NOW - 7000,
        restore_last_duration=0.5,
        window=WindowTelemetry(NOW - 3700, NOW - 3600, network_transmit_bytes=2147483648.0),
        recent_saves=(SaveRecord(9000, NOW - 600, NOW - 60, (), "aborted"),),
        recent_restores=(
            RestoreRecord(NOW - 7000, True, 20.0),
            RestoreRecord(NOW - 3000, False, 0.5, "RuntimeError: unexpected EOF"),
        ),
        last_committed_valid=False,
        version=11,
    )


def _finished() -> JobState:
    """A job the config says is finished (``finished: true``, hence +Inf), idle for a day."""
    name = "t5-xl"
    return JobState(
        name=name,
        layout="orbax",
        paths=(WatchedPath(DURABLE, f"/lustre/ckpt/{name}", "poll", "/lustre"),),
        interval_seconds=1200.0,
        deadline_seconds=600.0,
        retained_generations_limit=1,
        restore_drill_max_age_seconds=604800.0,
        abandon_after_seconds=3600.0,
        first_seen=NOW - 604800,
        alive_at=NOW - 90000,
        finished=True,
        finished_at=float("inf"),
        heartbeat_at=NOW - 90000,
        generations=(_gen("50000", DURABLE, COMMITTED, 50000, 90600, 600, 8 * GIB, 77, True),),
        saves_committed=0,
        last_committed_valid=True,
        version=2,
    )


def _unreadable() -> JobState:
    """A tree its last read could not all read, whose staging directory does not exist yet, on
    a mount that hangs; its path needs escaping in a label value."""
    name = "vit-h"
    return JobState(
        name=name,
        layout="lightning",
        paths=(
            WatchedPath(STAGING, f"/scratch/stage/{name}", "poll", "/scratch", missing=True),
            WatchedPath(
                DURABLE, f'/scratch/ckpt/{name} "v2"\\old', "poll", "/scratch", unreadable=2
            ),
        ),
        interval_seconds=1800.0,
        deadline_seconds=600.0,
        retained_generations_limit=3,
        restore_drill_max_age_seconds=604800.0,
        first_seen=NOW - 600,
        version=1,
    )


def _spool_only() -> JobState:
    """Known to this node-scope process from its ranks' spool events alone: the shared scanners
    read its tree (not scanned here), so only the per-node clocks are exported."""
    name = "mixtral-8x22b"
    return JobState(
        name=name,
        layout="megatron",
        paths=(WatchedPath(DURABLE, f"/lustre/ckpt/{name}", scanned=False),),
        interval_seconds=1800.0,
        deadline_seconds=450.0,
        retained_generations_limit=3,
        restore_drill_max_age_seconds=604800.0,
        first_seen=NOW - 7200,
        alive_at=NOW - 2,
        heartbeat_at=NOW - 2,
        last_phases=(("pause", 1.5), ("total", 95.25), ("write", 80.0)),
        last_save_symptoms=("straggler", "contention"),
        save_symptoms=(("contention", 2), ("straggler", 3)),
        saves_timed=True,
        last_write_end=NOW - 905.75,
        last_write_spread=14.5,
        window=WindowTelemetry(NOW - 1000, NOW - 905, 9e10, 0.5, 0.0, 0.9, 0.95),
        version=5,
    )


def snapshot() -> Snapshot:
    """The reference state: six jobs (one per situation above), three filesystems (one hung),
    the exporter's own health mid-way through a first pass, every telemetry source present."""
    jobs = (_broken(), _saving(), _two_tiers(), _spool_only(), _finished(), _unreadable())
    daemon = DaemonState(
        scans=HistogramState(_SCAN_BOUNDS, (120, 340, 80, 25, 9, 3, 1, 0, 0, 0, 0, 1), 125.875),
        metadata_operations=1_234_567,
        watch_overflows=1,
        scan_errors=4,
        spool_events=(
            ("committed", 52),
            ("heartbeat", 9001),
            ("restore_done", 2),
            ("restore_failed", 1),
            ("save_failed", 1),
            ("save_start", 54),
            ("staged", 12),
            ("written", 53),
        ),
        spool_invalid=(("not_json", 3), ("schema", 1), ("too_long", 1), ("unknown_event", 2)),
        spool_dropped=(("future", 2), ("ranks_cap", 1)),
        spool_dropped_bytes=(("backlog", 1048576), ("owner", 512), ("unknown_job", 4096)),
        spool_squatted=(("gpt-13b", 1),),
        spool_backlog_bytes=65536,
        spool_poll_seconds=12.375,
        discover_excess=(("/lustre/ckpt", 3),),
        discover_missing=(("/scratch/discover", 1),),
        spool_writable=True,
        object_stores=(  # a job checkpointing to S3: one killed save's upload left open
            (
                "gpt-13b",
                ObjectStoreUsage(
                    requests=(("get", 4), ("list", 96), ("list_parts", 3), ("list_uploads", 40)),
                    errors=(("list", "SlowDown", 2),),
                    incomplete_uploads=1,
                    incomplete_upload_bytes=268435456,
                    oldest_incomplete_upload=NOW - 5400,
                ),
            ),
        ),
        ready=False,  # vit-h's durable tier is still in its first pass (the hung mount)
        first_scans=(
            ("bert-large", DURABLE, True, 4),
            ("gpt-13b", DURABLE, True, 31),
            ("llama-70b", DURABLE, True, 1540),
            ("llama-70b", STAGING, True, 1030),
            ("t5-xl", DURABLE, True, 80),
            ("vit-h", DURABLE, False, 48213),
            ("vit-h", STAGING, True, 0),
        ),
        mounts=(("/lustre", False), ("/nvme", False), ("/scratch", True)),
        scan_success=(
            ("bert-large", DURABLE, NOW - 3.5),
            ("gpt-13b", DURABLE, NOW - 0.25),
            ("llama-70b", DURABLE, NOW - 12),
            ("llama-70b", STAGING, NOW - 0.5),
            ("t5-xl", DURABLE, NOW - 14),
            ("vit-h", STAGING, NOW - 300),
        ),
        config_reload_successful=False,  # the last SIGHUP's file did not parse
        config_reload_success_time=NOW - 86400,
        shard_info=(1, 4, "node,shared"),
        worker_task_failures=(("/scratch", 1),),
    )
    filesystems = (
        FilesystemState(
            "/lustre",
            "10.0.0.1@o2ib:/lustre",
            "lustre",
            1 << 50,
            123 << 40,
            0.1,
            checked_at=NOW - 1,
        ),
        FilesystemState(
            "/nvme", "/dev/nvme0n1", "xfs", 7 << 40, (7 << 40) - 280 * GIB, 0.25, checked_at=NOW - 1
        ),
        FilesystemState(
            "/scratch",
            "nas:/export/scratch",
            "nfs4",
            100 << 40,
            40 << 40,
            0.05,
            device_error=True,
            checked_at=NOW - 600,
        ),
    )
    telemetry = (("disk", True), ("gpu", True), ("infiniband", True), ("network", True))
    return Snapshot(jobs, daemon, filesystems, telemetry)


def starting() -> Snapshot:
    """The port opens before the first pass: a configured job not read yet, no filesystem
    probed, no telemetry sampled. The collectors with no data say so (success 0) and export
    nothing."""
    name = "llama-70b"
    job = JobState(
        name=name,
        layout="dcp",
        paths=(
            WatchedPath(STAGING, f"/nvme/ckpt/{name}"),
            WatchedPath(DURABLE, f"/lustre/ckpt/{name}"),
        ),
        interval_seconds=1800.0,
        deadline_seconds=450.0,
        retained_generations_limit=3,
        restore_drill_max_age_seconds=604800.0,
        first_seen=NOW,
        version=1,
    )
    daemon = DaemonState(
        first_scans=((name, DURABLE, False, 0), (name, STAGING, False, 17)),
        spool_writable=False,  # the spool directory is not there yet
        config_reload_success_time=NOW,
    )
    return Snapshot((job,), daemon)


# Golden file stem -> the snapshot it renders.
SNAPSHOTS: dict[str, Callable[[], Snapshot]] = {"metrics": snapshot, "starting": starting}

# The one place a rendered golden file is normalised: the values no fixed snapshot fixes. The
# build info's labels name the exporter's and the running Python's versions, and each collector's
# scrape duration is measured on every render. The label names, the lines and their order stay;
# only those values are replaced. Nothing else is touched (tests/exposition/test_golden.py holds
# it to that), and the runtime families (process_*, python_*) are excluded by construction: the
# renderer is given no runtime registry.
_BUILD_INFO = re.compile(rb'\b(version|python_version)="[^"]*"')
_DURATION = re.compile(rb"^(checkpoint_exporter_scrape_collector_duration_seconds\{[^}]*\}) \S+$")


def normalise(body: bytes) -> bytes:
    lines = []
    for line in body.split(b"\n"):
        if line.startswith(b"checkpoint_exporter_build_info{"):
            line = _BUILD_INFO.sub(rb'\1="(normalised)"', line)
        else:
            line = _DURATION.sub(rb"\1 0.0", line)
        lines.append(line)
    return b"\n".join(lines)


def renderer(state: Snapshot) -> Renderer:
    """The scrape's renderer over ``state``, every collector on (not only the default ones),
    without the runtime metrics."""
    return Renderer(lambda: state, enabled_collectors(dict.fromkeys(REGISTRY, True)))


def render(stem: str, suffix: str) -> str:
    """The golden file ``<stem>.<suffix>``: ``SNAPSHOTS[stem]`` as a fresh scrape with the
    Accept header ``FORMATS[suffix]`` renders it, normalised."""
    encoder, _ = choose_encoder(FORMATS[suffix])
    return normalise(renderer(SNAPSHOTS[stem]()).render(encoder)).decode()


def files() -> dict[str, str]:
    """Every golden file, by its path relative to the repository root."""
    return {
        f"tests/exposition/golden/{stem}.{suffix}": render(stem, suffix)
        for stem in SNAPSHOTS
        for suffix in FORMATS
    }
