"""Per-job state, owned by one writer and published to scrapes as an immutable Snapshot."""

from __future__ import annotations

import time

from checkpoint_exporter.config import Config, JobConfig
from checkpoint_exporter.model import DURABLE, STAGING, JobState, Snapshot, WatchedPath


def _job_state(job: JobConfig) -> JobState:
    paths = [WatchedPath(DURABLE, str(job.path))]
    if job.staging is not None:
        paths.append(WatchedPath(STAGING, str(job.staging)))
    return JobState(
        name=job.name,
        layout=job.policy.layout,
        paths=tuple(paths),
        interval_seconds=job.policy.interval,
        deadline_seconds=job.policy.deadline,
        retained_generations_limit=job.policy.retained_generations,
        restore_drill_max_age_seconds=job.policy.restore_drill_max_age,
    )


class Tracker:
    """Holds the state of every watched job.

    Only the tracker's owner thread calls ``publish``; scrapes read ``snapshot``, a reference
    swapped atomically, so a scrape never waits for a scan and never sees half an update.
    """

    def __init__(self, config: Config):
        self._jobs = {job.name: _job_state(job) for job in config.jobs}
        self.snapshot = Snapshot(taken_at=time.time())

    def publish(self) -> Snapshot:
        self.snapshot = Snapshot(taken_at=time.time(), jobs=tuple(self._jobs.values()))
        return self.snapshot
