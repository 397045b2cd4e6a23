"""Watched jobs and the objectives they are held to, so one alert rule fits every job."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import Metric
from prometheus_client.utils import floatToGoString

from checkpoint_exporter.exposition.collectors.base import MetricSpec, SnapshotCollector
from checkpoint_exporter.model import Snapshot, reads_a_tree

_JOB = ("training_job",)
JOB_INFO = MetricSpec(
    "checkpoint_job_info",
    "gauge",
    "What is watched: one series per training job and storage tier.",
    ("training_job", "layout", "tier", "path"),
)
WATCH_INFO = MetricSpec(
    "checkpoint_exporter_watch_info",
    "gauge",
    "How each watched path is followed: inotify or poll.",
    ("training_job", "tier", "mode"),
)
DEADLINE_BUCKET_INFO = MetricSpec(
    "checkpoint_deadline_bucket_info",
    "gauge",
    "The `le` of the save-duration bucket at the job's deadline (label `bucket`; promtool "
    "reserves `le` for histograms), for SLO rules to select that bucket.",
    ("training_job", "bucket"),
)
INTERVAL_SECONDS = MetricSpec(
    "checkpoint_interval_seconds", "gauge", "The job's checkpoint interval objective.", _JOB
)
DEADLINE_SECONDS = MetricSpec(
    "checkpoint_deadline_seconds",
    "gauge",
    "The job's deadline from save start to durable commit.",
    _JOB,
)
RETAINED_GENERATIONS_LIMIT = MetricSpec(
    "checkpoint_retained_generations_limit",
    "gauge",
    "The job's configured retention: committed generations it should keep.",
    _JOB,
)
RESTORE_DRILL_MAX_AGE_SECONDS = MetricSpec(
    "checkpoint_restore_drill_max_age_seconds",
    "gauge",
    "Longest time allowed since the job's last successful restore drill.",
    _JOB,
)

MTBF_SECONDS = MetricSpec(
    "checkpoint_mtbf_seconds",
    "gauge",
    "The job's reliability objective: mean time between interruptions that restart it from its "
    "newest checkpoint (config `mtbf`); only for jobs that set it.",
    _JOB,
)
ABANDON_AFTER_SECONDS = MetricSpec(
    "checkpoint_job_abandon_after_seconds",
    "gauge",
    "How long the job may show no sign of life before it is presumed gone and stops paging "
    "(config `abandon_after`).",
    _JOB,
)
PAGING = MetricSpec(
    "checkpoint_job_paging",
    "gauge",
    "1 when the job's checkpoint failures page (critical), 0 when they open tickets: a "
    "discovered job whose interval and deadline nobody stated (config `page`).",
    _JOB,
)
# Liveness: every process that knows the job exports what it saw of it.
FIRST_SEEN = MetricSpec(
    "checkpoint_job_first_seen_timestamp_seconds",
    "gauge",
    "When this exporter started watching the job.",
    _JOB,
)
ALIVE = MetricSpec(
    "checkpoint_job_alive_timestamp_seconds",
    "gauge",
    "The job's last sign of life seen here: a heartbeat or any spool event of its own, or a "
    "write in its checkpoint tree. Absent until one is seen.",
    _JOB,
)
FINISHED = MetricSpec(
    "checkpoint_job_finished",
    "gauge",
    "1 once the job said it finished (instrument.finished) and has not run since, or the "
    "config says `finished: true`; else 0. Nothing pages for a finished job.",
    _JOB,
)
FINISHED_AT = MetricSpec(
    "checkpoint_job_finished_timestamp_seconds",
    "gauge",
    "When the job said it finished (instrument.finished), +Inf where the config says `finished: "
    "true`; absent while it runs. The rules hold a job finished while no exporter saw it alive "
    "later (so one node's old `finished` does not silence a new run elsewhere).",
    _JOB,
)
HEARTBEAT = MetricSpec(
    "checkpoint_job_heartbeat_timestamp_seconds",
    "gauge",
    "The job's newest heartbeat seen here (instrument.start, and every save, heartbeat while "
    "the training process runs): a job that heartbeats and stopped doing so is not running.",
    _JOB,
)
PATH_MISSING = MetricSpec(
    "checkpoint_exporter_path_missing",
    "gauge",
    "1 while a watched directory does not exist (not yet, or no longer): watched from when it "
    "appears.",
    ("training_job", "tier"),
)
UNREADABLE_PATHS = MetricSpec(
    "checkpoint_exporter_unreadable_paths",
    "gauge",
    "Directories of a watched tree that its last read could not read (permissions, I/O "
    "errors); what was known below them is kept as it was.",
    ("training_job", "tier"),
)


class JobsCollector(SnapshotCollector):
    name = "jobs"
    per_job = True
    specs = (
        JOB_INFO, WATCH_INFO, PATH_MISSING, UNREADABLE_PATHS, FIRST_SEEN, ALIVE, FINISHED,
        FINISHED_AT, HEARTBEAT,
        DEADLINE_BUCKET_INFO, INTERVAL_SECONDS, DEADLINE_SECONDS, RETAINED_GENERATIONS_LIMIT,
        RESTORE_DRILL_MAX_AGE_SECONDS, ABANDON_AFTER_SECONDS, PAGING, MTBF_SECONDS,
    )  # fmt: skip

    def collect(self, snapshot: Snapshot) -> Iterable[Metric]:
        (
            info, watch, missing, unreadable, first_seen, alive, finished, finished_at, heartbeat,
            deadline_bucket, *rest,
        ) = (spec.family() for spec in self.specs)  # fmt: skip
        *objectives, mtbf = rest
        for job in snapshot.jobs:
            name = [job.name]
            for watched in job.paths:
                if not watched.scanned:
                    continue  # outside this process's scopes: another one watches it
                info.add_metric([job.name, job.layout, watched.tier, watched.path], 1)
                missing.add_metric([job.name, watched.tier], float(watched.missing))
                unreadable.add_metric([job.name, watched.tier], watched.unreadable)
                if watched.mode:
                    watch.add_metric([job.name, watched.tier, watched.mode], 1)
            first_seen.add_metric(name, job.first_seen)
            if job.alive_at is not None:
                alive.add_metric(name, job.alive_at)
            finished.add_metric(name, float(job.finished))
            if job.finished_at is not None:
                finished_at.add_metric(name, job.finished_at)
            if job.heartbeat_at is not None:
                heartbeat.add_metric(name, job.heartbeat_at)
            if not reads_a_tree(job):
                continue  # known from the spool alone: its trees' readers export the objectives
            deadline_bucket.add_metric([job.name, floatToGoString(job.deadline_seconds)], 1)
            values = (
                job.interval_seconds, job.deadline_seconds, job.retained_generations_limit,
                job.restore_drill_max_age_seconds, job.abandon_after_seconds, float(job.paging),
            )  # fmt: skip
            for family, value in zip(objectives, values, strict=True):
                family.add_metric(name, value)
            if job.mtbf_seconds is not None:  # optional: no Young / Daly interval without it
                mtbf.add_metric(name, job.mtbf_seconds)
        return [
            info, watch, missing, unreadable, first_seen, alive, finished, finished_at, heartbeat,
            deadline_bucket, *objectives, mtbf,
        ]  # fmt: skip
