"""Two-tier jobs: what is committed on fast staging storage and not yet on durable storage."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import Metric

from checkpoint_exporter import metrics
from checkpoint_exporter.model import STAGING, Snapshot


class DrainCollector(metrics.SnapshotCollector):
    name = "drain"
    per_job = True

    def collect(self, snapshot: Snapshot) -> Iterable[Metric]:
        specs = (
            metrics.DRAIN_BACKLOG_BYTES, metrics.DRAIN_BACKLOG_GENERATIONS,
            metrics.OLDEST_UNDRAINED_COMMIT, metrics.STAGED_BYTES, metrics.DRAINED_BYTES,
            metrics.DRAIN_LOST,
        )  # fmt: skip
        families = {spec: spec.family() for spec in specs}
        for job in snapshot.jobs:
            if not any(path.tier == STAGING for path in job.paths):
                continue
            values = {
                metrics.DRAIN_BACKLOG_BYTES: job.drain_backlog_bytes,
                metrics.DRAIN_BACKLOG_GENERATIONS: job.drain_backlog_generations,
                metrics.OLDEST_UNDRAINED_COMMIT: job.oldest_undrained_commit,
                metrics.STAGED_BYTES: job.staged_bytes,
                metrics.DRAINED_BYTES: job.drained_bytes,
                metrics.DRAIN_LOST: job.lost_generations,
            }
            for spec, value in values.items():
                families[spec].add_metric([job.name], value)
        return list(families.values())
