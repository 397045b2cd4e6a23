"""Restores: drills and the loads training jobs report through ``instrument.restoring``."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import Metric

from checkpoint_exporter import metrics
from checkpoint_exporter.model import Snapshot


class RestoresCollector(metrics.SnapshotCollector):
    name = "restores"
    per_job = True

    def collect(self, snapshot: Snapshot) -> Iterable[Metric]:
        success = metrics.RESTORE_LAST_SUCCESS.family()
        duration = metrics.RESTORE_LAST_DURATION.family()
        total = metrics.RESTORES.family()
        failures = metrics.RESTORE_FAILURES.family()
        for job in snapshot.jobs:
            name = [job.name]
            if job.restore_last_success is not None:
                success.add_metric(name, job.restore_last_success)
            if job.restore_last_duration is not None:
                duration.add_metric(name, job.restore_last_duration)
            total.add_metric(name, job.restores)
            failures.add_metric(name, job.restore_failures)
        return [success, duration, total, failures]
