"""Watched jobs and the objectives they are held to, so one alert rule fits every job."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import Metric
from prometheus_client.utils import floatToGoString

from checkpoint_exporter import metrics
from checkpoint_exporter.model import Snapshot


class JobsCollector(metrics.SnapshotCollector):
    name = "jobs"
    per_job = True

    def collect(self, snapshot: Snapshot) -> Iterable[Metric]:
        info = metrics.JOB_INFO.family()
        watch = metrics.WATCH_INFO.family()
        deadline_bucket = metrics.DEADLINE_BUCKET_INFO.family()
        objectives = {
            spec: spec.family()
            for spec in (
                metrics.INTERVAL_SECONDS,
                metrics.DEADLINE_SECONDS,
                metrics.RETAINED_GENERATIONS_LIMIT,
                metrics.RESTORE_DRILL_MAX_AGE_SECONDS,
            )
        }
        for job in snapshot.jobs:
            for watched in job.paths:
                info.add_metric([job.name, job.layout, watched.tier, watched.path], 1)
                if watched.mode:
                    watch.add_metric([job.name, watched.tier, watched.mode], 1)
            deadline_bucket.add_metric([job.name, floatToGoString(job.deadline_seconds)], 1)
            objectives[metrics.INTERVAL_SECONDS].add_metric([job.name], job.interval_seconds)
            objectives[metrics.DEADLINE_SECONDS].add_metric([job.name], job.deadline_seconds)
            objectives[metrics.RETAINED_GENERATIONS_LIMIT].add_metric(
                [job.name], job.retained_generations_limit
            )
            objectives[metrics.RESTORE_DRILL_MAX_AGE_SECONDS].add_metric(
                [job.name], job.restore_drill_max_age_seconds
            )
        return [info, watch, deadline_bucket, *objectives.values()]
