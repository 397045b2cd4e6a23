"""Every job's tracker, by job name, and the snapshot published to scrapes.

One thread (the daemon's core) owns them and calls ``publish``; scrapes read ``snapshot``, a
reference swapped atomically, so a scrape never waits for a read and never sees half an update.
The daemon reaches a job's core through here by its name (``apply``, ``state``; ``start``,
``life``, ``forget``), never holding the ``JobTracker`` itself.
"""

from __future__ import annotations

from collections.abc import Collection

from checkpoint_exporter.config import Config, JobConfig, Policy
from checkpoint_exporter.core.inputs import Effects, Input
from checkpoint_exporter.core.liveness import Life
from checkpoint_exporter.core.tracker import JobTracker
from checkpoint_exporter.model import (
    DURABLE,
    STAGING,
    DaemonState,
    FilesystemState,
    JobState,
    Snapshot,
    WatchedPath,
)


def job_paths(job: JobConfig) -> tuple[WatchedPath, ...]:
    paths = [WatchedPath(DURABLE, str(job.path))]
    if job.staging is not None:
        paths.append(WatchedPath(STAGING, str(job.staging)))
    return tuple(paths)


class Tracker:
    """Every job's tracker, and the published snapshot."""

    def __init__(self, config: Config):
        self.diagnosis = config.diagnosis
        # A save's diagnosis waits for its window's telemetry, correlated 1.5 samples after its
        # end: a slow sampler gets a longer grace.
        self.telemetry_grace = max(
            config.diagnosis.telemetry_grace, 3 * config.telemetry.sample_interval
        )
        self.jobs: dict[str, JobTracker] = {}
        for job in config.jobs:
            if config.serving.tracks(job.name):  # a shared-scope process: its shard's jobs only
                self.add(JobTracker(job.name, job_paths(job), job.policy))
        self.snapshot = Snapshot(daemon=DaemonState())
        self._published: dict[str, JobState] = {}  # in the order of ``jobs``

    def add(self, job: JobTracker) -> None:
        job.thresholds, job.telemetry_grace = self.diagnosis, self.telemetry_grace
        job.neighbours = self.spans_of_others
        self.jobs[job.name] = job

    def spans_of_others(self, name: str) -> list[tuple[float, float]]:
        """Every other job's save spans on this node (for the contention diagnosis)."""
        return [
            span for other, job in self.jobs.items() if other != name for span in job.busy_spans()
        ]

    # --- the daemon's calls: a job by its name, never the JobTracker itself --------------------

    def start(
        self, name: str, paths: tuple[WatchedPath, ...], policy: Policy, first_seen: float,
        life: Life | None = None,
    ) -> None:  # fmt: skip
        """Track a job from now on; ``life``: what an earlier tracker of it knew (a reload)."""
        job = JobTracker(name, paths, policy, first_seen=first_seen)
        if life is not None:
            job.take_life(life)
        self.add(job)

    def apply(self, name: str, message: Input) -> Effects | None:
        """The job's ``JobTracker.apply`` (None: no such job)."""
        job = self.jobs.get(name)
        return job.apply(message) if job is not None else None

    def state(self, name: str) -> JobState | None:
        job = self.jobs.get(name)
        return job.state() if job is not None else None

    def life(self, name: str) -> Life | None:
        job = self.jobs.get(name)
        return job.life() if job is not None else None

    def __contains__(self, name: object) -> bool:
        return name in self.jobs

    def names(self) -> list[str]:
        return list(self.jobs)

    def forget(self, name: str) -> None:
        self.jobs.pop(name, None)

    def publish(
        self,
        daemon: DaemonState | None = None,
        filesystems: tuple[FilesystemState, ...] | None = None,
        telemetry: tuple[tuple[str, bool], ...] | None = None,
        changed: Collection[str] | None = None,
    ) -> Snapshot:
        """Swap in a new snapshot, or keep the current one when nothing changed (so a scrape
        can reuse what it rendered for it).

        ``changed``: the jobs added, removed or touched since the last publish (None: look at
        every job), so a publish costs what changed."""
        current = self.snapshot
        daemon = daemon if daemon is not None else current.daemon
        filesystems = filesystems if filesystems is not None else current.filesystems
        telemetry = telemetry if telemetry is not None else current.telemetry
        moved = added = False
        if changed is None:
            for name in [n for n in self._published if n not in self.jobs]:
                del self._published[name]
                moved = True
        for name in self.jobs if changed is None else changed:
            job = self.jobs.get(name)
            if job is None:
                moved = self._published.pop(name, None) is not None or moved
                continue
            state = job.state()
            if self._published.get(name) is not state:
                added = added or name not in self._published
                self._published[name] = state
                moved = True
        if added:  # kept in the order of ``jobs``
            self._published = {n: self._published[n] for n in self.jobs if n in self._published}
        if moved or (daemon, filesystems, telemetry) != (
            current.daemon,
            current.filesystems,
            current.telemetry,
        ):
            jobs = tuple(self._published.values()) if moved else current.jobs
            self.snapshot = Snapshot(jobs, daemon, filesystems, telemetry)
        return self.snapshot
