"""Checkpoint generations on disk: the newest committed one, saves in progress, lifecycle counts."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import Metric

from checkpoint_exporter.exposition.collectors.base import (
    MetricSpec,
    SnapshotCollector,
    add_histogram,
)
from checkpoint_exporter.model import (
    COMMITTED,
    DURABLE,
    REASONS,
    WRITING,
    JobState,
    Snapshot,
    scanned,
)

_JOB = ("training_job",)
LAST_COMMITTED_TIMESTAMP = MetricSpec(
    "checkpoint_last_committed_timestamp_seconds",
    "gauge",
    "Commit time of the newest committed generation on the durable tier.",
    _JOB,
)
LAST_COMMITTED_STEP = MetricSpec(
    "checkpoint_last_committed_step",
    "gauge",
    "Training step of the newest committed generation, when the layout records it.",
    _JOB,
)
LAST_COMMITTED_SIZE = MetricSpec(
    "checkpoint_last_committed_size_bytes",
    "gauge",
    "Bytes in the newest committed generation.",
    _JOB,
)
LAST_COMMITTED_FILES = MetricSpec(
    "checkpoint_last_committed_files",
    "gauge",
    "Files in the newest committed generation.",
    _JOB,
)
LAST_COMMITTED_VALID = MetricSpec(
    "checkpoint_last_committed_valid",
    "gauge",
    "1 if the newest committed generation passed structural validation, 0 if it failed.",
    _JOB,
)
SAVES_IN_PROGRESS = MetricSpec(
    "checkpoint_saves_in_progress",
    "gauge",
    "Saves started and neither committed nor aborted.",
    _JOB,
)
OLDEST_SAVE_IN_PROGRESS_START = MetricSpec(
    "checkpoint_oldest_save_in_progress_start_timestamp_seconds",
    "gauge",
    "Start time of the oldest save in progress; 0 when none is.",
    _JOB,
)
LAST_SAVE_START = MetricSpec(
    "checkpoint_last_save_start_timestamp_seconds",
    "gauge",
    "Start time of the newest save, committed or not.",
    _JOB,
)
SAVES_COMMITTED = MetricSpec(
    "checkpoint_saves_committed_total",
    "counter",
    "Saves committed while the exporter ran.",
    _JOB,
)
SAVES_ABORTED = MetricSpec(
    "checkpoint_saves_aborted_total",
    "counter",
    "Saves abandoned before they committed, while the exporter ran: their ranks reported "
    "save_failed, a newer save committed while they stood still, or nothing moved for "
    "abort_after (a save that commits late is a deadline miss, not an abort).",
    _JOB,
)
DEADLINE_MISSES = MetricSpec(
    "checkpoint_deadline_misses_total",
    "counter",
    "Saves whose start-to-commit time exceeded the job's deadline.",
    _JOB,
)
SAVE_DURATION = MetricSpec(
    "checkpoint_save_duration_seconds",
    "histogram",
    "Duration of each phase of a save; the job's deadline is a bucket boundary.",
    ("training_job", "phase"),
)
SAVES_WITHIN_DEADLINE = MetricSpec(
    "checkpoint_saves_within_deadline_total",
    "counter",
    "Saves whose start-to-durable-commit time was within the job's deadline; with the "
    "histogram's total count, a deadline SLO ratio reads two series per job.",
    _JOB,
)
LAST_SAVE_PHASE = MetricSpec(
    "checkpoint_last_save_phase_seconds",
    "gauge",
    "Duration of each phase of the newest committed save.",
    ("training_job", "phase"),
)
LAST_SAVE_WRITE_END = MetricSpec(
    "checkpoint_last_save_local_write_end_timestamp_seconds",
    "gauge",
    "When the newest save's last rank on this node finished writing (cross-node stragglers).",
    _JOB,
)
LAST_SAVE_LOCAL_STEP = MetricSpec(
    "checkpoint_last_save_local_step",
    "gauge",
    "The step of the save checkpoint_last_save_local_write_end_timestamp_seconds is of (when its "
    "events name one): cross-node rules compare only the nodes of the job's newest save.",
    _JOB,
)
LAST_SAVE_WRITE_SPREAD = MetricSpec(
    "checkpoint_last_save_local_write_spread_seconds",
    "gauge",
    "Spread of the newest save's write ends across this node's ranks.",
    _JOB,
)
LOCAL_SAVES_IN_PROGRESS = MetricSpec(
    "checkpoint_local_saves_in_progress",
    "gauge",
    "Saves this node's ranks started (the spool) and have not all ended; a save whose ranks "
    "died counts until its timeline expires. Per node: the state timeline of saves per node.",
    _JOB,
)
RETAINED_GENERATIONS = MetricSpec(
    "checkpoint_retained_generations",
    "gauge",
    "Committed generations on the durable tier.",
    _JOB,
)
RETAINED_BYTES = MetricSpec(
    "checkpoint_retained_bytes",
    "gauge",
    "Bytes held by committed generations on the durable tier.",
    _JOB,
)
RETAINED_VALID_GENERATIONS = MetricSpec(
    "checkpoint_retained_valid_generations",
    "gauge",
    "Committed generations on the durable tier that passed structural validation.",
    _JOB,
)
VALIDATION_FAILURES = MetricSpec(
    "checkpoint_validation_failures_total",
    "counter",
    "Committed generations found structurally broken, by reason.",
    ("training_job", "reason"),
)
STORAGE_CLOCK_SKEW = MetricSpec(
    "checkpoint_storage_clock_skew_seconds",
    "gauge",
    "Newest file mtime minus this node's clock when the change was seen, the largest of the "
    "last 16 changes: positive when the storage's clock runs ahead; includes detection latency.",
    _JOB,
)


class CheckpointsCollector(SnapshotCollector):
    name = "checkpoints"
    per_job = True
    specs = (
        LAST_COMMITTED_TIMESTAMP, LAST_COMMITTED_STEP,
        LAST_COMMITTED_SIZE, LAST_COMMITTED_FILES,
        LAST_COMMITTED_VALID, SAVES_IN_PROGRESS,
        OLDEST_SAVE_IN_PROGRESS_START, LAST_SAVE_START,
        SAVES_COMMITTED, SAVES_ABORTED, DEADLINE_MISSES,
        SAVE_DURATION, SAVES_WITHIN_DEADLINE, LAST_SAVE_PHASE, LAST_SAVE_WRITE_END,
        LAST_SAVE_LOCAL_STEP,
        LAST_SAVE_WRITE_SPREAD, LOCAL_SAVES_IN_PROGRESS, RETAINED_GENERATIONS,
        RETAINED_BYTES, RETAINED_VALID_GENERATIONS,
        VALIDATION_FAILURES, STORAGE_CLOCK_SKEW,
    )  # fmt: skip

    def collect(self, snapshot: Snapshot) -> Iterable[Metric]:
        out = {spec: spec.family() for spec in self.specs}
        for job in snapshot.jobs:
            self._job(job, out)
        return list(out.values())

    @classmethod
    def _job(cls, job: JobState, out: dict[MetricSpec, Metric]) -> None:
        if scanned(job, DURABLE):  # else another process reads the tree (--scope, --shard)
            cls._from_tree(job, out)
        cls._from_clocks(job, out)

    @staticmethod
    def _from_clocks(job: JobState, out: dict[MetricSpec, Metric]) -> None:
        """The newest save's phases, from this node's ranks' clocks in the spool (a node-scope
        process has these alone), else from the durable tier's mtimes; and the deadline
        accounting, from the process that reads the durable tier."""
        name = [job.name]
        for phase, seconds in sorted(job.last_save_phases):
            out[LAST_SAVE_PHASE].add_metric([job.name, phase], seconds)
        if job.last_write_end is not None:
            out[LAST_SAVE_WRITE_END].add_metric(name, job.last_write_end)
            if job.last_write_step is not None:
                out[LAST_SAVE_LOCAL_STEP].add_metric(name, job.last_write_step)
        if job.last_write_spread is not None:
            out[LAST_SAVE_WRITE_SPREAD].add_metric(name, job.last_write_spread)
        if job.saves_timed:  # an instrumented job's ranks ran here
            out[LOCAL_SAVES_IN_PROGRESS].add_metric(name, job.local_saves_in_progress)
        if not scanned(job, DURABLE):
            # The durable commit ends a save: the process that sees it (a shared scanner) keeps
            # the job's one account. Every node counting its ranks' own saves of a shared job
            # made each per-job SLO rule reduce thousands of copies (docs/performance.md).
            return
        out[DEADLINE_MISSES].add_metric(name, job.deadline_misses)
        for phase, histogram in job.save_duration:
            add_histogram(out[SAVE_DURATION], [job.name, phase], histogram)
        out[SAVES_WITHIN_DEADLINE].add_metric(name, job.saves_within_deadline)

    @staticmethod
    def _from_tree(job: JobState, out: dict[MetricSpec, Metric]) -> None:
        """What the durable tier's generations say."""
        name, newest = [job.name], job.newest_committed
        durable = [gen for gen in job.generations if gen.tier == DURABLE]
        if newest is not None:
            out[LAST_COMMITTED_TIMESTAMP].add_metric(name, newest.commit_time or 0.0)
            if newest.step is not None:
                out[LAST_COMMITTED_STEP].add_metric(name, newest.step)
            out[LAST_COMMITTED_SIZE].add_metric(name, newest.bytes)
            out[LAST_COMMITTED_FILES].add_metric(name, newest.files)
        if job.last_committed_valid is not None:
            out[LAST_COMMITTED_VALID].add_metric(name, 1 if job.last_committed_valid else 0)
        writing = [gen for gen in durable if gen.state == WRITING]
        out[SAVES_IN_PROGRESS].add_metric(name, len(writing))
        out[OLDEST_SAVE_IN_PROGRESS_START].add_metric(
            name, min((gen.start_time for gen in writing), default=0.0)
        )
        if durable:
            out[LAST_SAVE_START].add_metric(name, max(gen.start_time for gen in durable))
        out[SAVES_COMMITTED].add_metric(name, job.saves_committed)
        out[SAVES_ABORTED].add_metric(name, job.saves_aborted)
        retained = [gen for gen in durable if gen.state == COMMITTED]
        out[RETAINED_GENERATIONS].add_metric(name, len(retained))
        out[RETAINED_BYTES].add_metric(
            name, sum(gen.bytes for gen in durable if gen.state == COMMITTED)
        )
        out[RETAINED_VALID_GENERATIONS].add_metric(name, sum(1 for gen in retained if gen.valid))
        if job.storage_clock_skew is not None:
            out[STORAGE_CLOCK_SKEW].add_metric(name, job.storage_clock_skew)
        failures = dict(job.validation_failures)
        for reason in REASONS:
            out[VALIDATION_FAILURES].add_metric([job.name, reason], failures.get(reason, 0))
