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


class JobsCollector(SnapshotCollector):
    name = "jobs"
    per_job = True
    specs = (
        JOB_INFO, WATCH_INFO, DEADLINE_BUCKET_INFO, INTERVAL_SECONDS, DEADLINE_SECONDS,
        RETAINED_GENERATIONS_LIMIT, RESTORE_DRILL_MAX_AGE_SECONDS, MTBF_SECONDS,
    )  # fmt: skip

    def collect(self, snapshot: Snapshot) -> Iterable[Metric]:
        info, watch, deadline_bucket, *objectives, mtbf = (spec.family() for spec in self.specs)
        for job in snapshot.jobs:
            for watched in job.paths:
                if not watched.scanned:
                    continue  # outside this process's scopes: another one watches it
                info.add_metric([job.name, job.layout, watched.tier, watched.path], 1)
                if watched.mode:
                    watch.add_metric([job.name, watched.tier, watched.mode], 1)
            if not reads_a_tree(job):
                continue  # known from the spool alone: its trees' readers export the objectives
            deadline_bucket.add_metric([job.name, floatToGoString(job.deadline_seconds)], 1)
            values = (
                job.interval_seconds, job.deadline_seconds, job.retained_generations_limit,
                job.restore_drill_max_age_seconds,
            )  # fmt: skip
            for family, value in zip(objectives, values, strict=True):
                family.add_metric([job.name], value)
            if job.mtbf_seconds is not None:  # optional: no Young / Daly interval without it
                mtbf.add_metric([job.name], job.mtbf_seconds)
        return [info, watch, deadline_bucket, *objectives, mtbf]
