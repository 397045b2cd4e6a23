"""Restores: drills and the loads training jobs report through ``instrument.restoring``."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import Metric

from checkpoint_exporter.exposition.collectors.base import MetricSpec, SnapshotCollector
from checkpoint_exporter.model import Snapshot

_JOB = ("training_job",)
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

# A failed drill opens a ticket; a training job that cannot load its checkpoint pages: the rules
# tell them apart by subtracting these from the totals above.
RESTORE_DRILLS = MetricSpec(
    "checkpoint_restore_drills_total",
    "counter",
    "Of the restores, the restore drills (checkpoint-exporter restore-drill) finished while "
    "the exporter ran.",
    _JOB,
)
RESTORE_DRILL_FAILURES = MetricSpec(
    "checkpoint_restore_drill_failures_total",
    "counter",
    "Of the failed restores, the restore drills.",
    _JOB,
)


class RestoresCollector(SnapshotCollector):
    name = "restores"
    per_job = True
    specs = (
        RESTORE_LAST_SUCCESS, RESTORE_LAST_DURATION, RESTORES, RESTORE_FAILURES, RESTORE_DRILLS,
        RESTORE_DRILL_FAILURES,
    )  # fmt: skip

    def collect(self, snapshot: Snapshot) -> Iterable[Metric]:
        success, duration, total, failures, drills, drill_failures = (
            spec.family() for spec in self.specs
        )
        for job in snapshot.jobs:
            name = [job.name]
            if job.restore_last_success is not None:
                success.add_metric(name, job.restore_last_success)
            if job.restore_last_duration is not None:
                duration.add_metric(name, job.restore_last_duration)
            total.add_metric(name, job.restores)
            failures.add_metric(name, job.restore_failures)
            drills.add_metric(name, job.restore_drills)
            drill_failures.add_metric(name, job.restore_drill_failures)
        return [success, duration, total, failures, drills, drill_failures]
