"""Two-tier jobs: what is committed on fast staging storage and not yet on durable storage."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import Metric

from checkpoint_exporter.exposition.collectors.base import MetricSpec, SnapshotCollector
from checkpoint_exporter.model import DURABLE, STAGING, Snapshot, scanned

_JOB = ("training_job",)
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


class DrainCollector(SnapshotCollector):
    name = "drain"
    per_job = True
    specs = (
        DRAIN_BACKLOG_BYTES, DRAIN_BACKLOG_GENERATIONS, OLDEST_UNDRAINED_COMMIT, STAGED_BYTES,
        DRAINED_BYTES, DRAIN_LOST,
    )  # fmt: skip

    def collect(self, snapshot: Snapshot) -> Iterable[Metric]:
        families = [spec.family() for spec in self.specs]
        for job in snapshot.jobs:
            if not (scanned(job, STAGING) and scanned(job, DURABLE)):
                continue  # one tier, or one read by another process (--scope): no drain here
            values = (
                job.drain_backlog_bytes, job.drain_backlog_generations,
                job.oldest_undrained_commit, job.staged_bytes, job.drained_bytes,
                job.lost_generations,
            )  # fmt: skip
            for family, value in zip(families, values, strict=True):
                family.add_metric([job.name], value)
        return families
