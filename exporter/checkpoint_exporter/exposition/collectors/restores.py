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


class RestoresCollector(SnapshotCollector):
    name = "restores"
    per_job = True
    specs = (RESTORE_LAST_SUCCESS, RESTORE_LAST_DURATION, RESTORES, RESTORE_FAILURES)

    def collect(self, snapshot: Snapshot) -> Iterable[Metric]:
        success, duration, total, failures = (spec.family() for spec in self.specs)
        for job in snapshot.jobs:
            name = [job.name]
            if job.restore_last_success is not None:
                success.add_metric(name, job.restore_last_success)
            if job.restore_last_duration is not None:
                duration.add_metric(name, job.restore_last_duration)
            total.add_metric(name, job.restores)
            failures.add_metric(name, job.restore_failures)
        return [success, duration, total, failures]
