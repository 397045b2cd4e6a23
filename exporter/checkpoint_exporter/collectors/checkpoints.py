"""Checkpoint generations on disk: the newest committed one, saves in progress, lifecycle counts."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import Metric

from checkpoint_exporter import metrics
from checkpoint_exporter.model import (
    COMMITTED,
    DURABLE,
    WRITING,
    JobState,
    Snapshot,
    newest_committed,
)
from checkpoint_exporter.validate import REASONS


class CheckpointsCollector(metrics.SnapshotCollector):
    name = "checkpoints"
    per_job = True

    def collect(self, snapshot: Snapshot) -> Iterable[Metric]:
        specs = (
            metrics.LAST_COMMITTED_TIMESTAMP, metrics.LAST_COMMITTED_STEP,
            metrics.LAST_COMMITTED_SIZE, metrics.LAST_COMMITTED_FILES,
            metrics.LAST_COMMITTED_VALID, metrics.SAVES_IN_PROGRESS,
            metrics.OLDEST_SAVE_IN_PROGRESS_START, metrics.LAST_SAVE_START,
            metrics.SAVES_COMMITTED, metrics.SAVES_ABORTED, metrics.DEADLINE_MISSES,
            metrics.SAVE_DURATION, metrics.LAST_SAVE_PHASE, metrics.LAST_SAVE_WRITE_END,
            metrics.LAST_SAVE_WRITE_SPREAD, metrics.RETAINED_GENERATIONS,
            metrics.RETAINED_BYTES, metrics.RETAINED_VALID_GENERATIONS,
            metrics.VALIDATION_FAILURES, metrics.STORAGE_CLOCK_SKEW,
        )  # fmt: skip
        out = {spec: spec.family() for spec in specs}
        for job in snapshot.jobs:
            self._job(job, out)
        return list(out.values())

    @staticmethod
    def _job(job: JobState, out: dict[metrics.MetricSpec, Metric]) -> None:
        name = [job.name]
        durable = [gen for gen in job.generations if gen.tier == DURABLE]
        newest = newest_committed(job)
        if newest is not None:
            out[metrics.LAST_COMMITTED_TIMESTAMP].add_metric(name, newest.commit_time or 0.0)
            if newest.step is not None:
                out[metrics.LAST_COMMITTED_STEP].add_metric(name, newest.step)
            out[metrics.LAST_COMMITTED_SIZE].add_metric(name, newest.bytes)
            out[metrics.LAST_COMMITTED_FILES].add_metric(name, newest.files)
        if job.last_committed_valid is not None:
            out[metrics.LAST_COMMITTED_VALID].add_metric(name, 1 if job.last_committed_valid else 0)
        phases = dict(job.last_phases)
        if not phases and newest is not None and newest.commit_time is not None:
            phases = {"total": max(0.0, newest.commit_time - newest.start_time)}  # disk only
        for phase, seconds in sorted(phases.items()):
            out[metrics.LAST_SAVE_PHASE].add_metric([job.name, phase], seconds)
        if job.last_write_end is not None:
            out[metrics.LAST_SAVE_WRITE_END].add_metric(name, job.last_write_end)
        if job.last_write_spread is not None:
            out[metrics.LAST_SAVE_WRITE_SPREAD].add_metric(name, job.last_write_spread)
        writing = [gen for gen in durable if gen.state == WRITING]
        out[metrics.SAVES_IN_PROGRESS].add_metric(name, len(writing))
        out[metrics.OLDEST_SAVE_IN_PROGRESS_START].add_metric(
            name, min((gen.start_time for gen in writing), default=0.0)
        )
        if durable:
            out[metrics.LAST_SAVE_START].add_metric(name, max(gen.start_time for gen in durable))
        out[metrics.SAVES_COMMITTED].add_metric(name, job.saves_committed)
        out[metrics.SAVES_ABORTED].add_metric(name, job.saves_aborted)
        out[metrics.DEADLINE_MISSES].add_metric(name, job.deadline_misses)
        for phase, histogram in job.save_duration:
            metrics.add_histogram(out[metrics.SAVE_DURATION], [job.name, phase], histogram)
        retained = [gen for gen in durable if gen.state == COMMITTED and not gen.alias]
        out[metrics.RETAINED_GENERATIONS].add_metric(name, len(retained))
        out[metrics.RETAINED_BYTES].add_metric(
            name, sum(gen.bytes for gen in durable if gen.state == COMMITTED)
        )
        out[metrics.RETAINED_VALID_GENERATIONS].add_metric(
            name, sum(1 for gen in retained if gen.valid)
        )
        if job.storage_clock_skew is not None:
            out[metrics.STORAGE_CLOCK_SKEW].add_metric(name, job.storage_clock_skew)
        failures = dict(job.validation_failures)
        for reason in REASONS:
            out[metrics.VALIDATION_FAILURES].add_metric([job.name, reason], failures.get(reason, 0))
