"""The scanner's side of a job's timers and verdicts: the job's timer armed from its tracker,
verdicts applied, unchecked generations asked again on the job's timer, a save's telemetry
window correlated once its samples are in."""

from __future__ import annotations

import queue

from checkpoint_exporter.core.tracker import JobTracker
from checkpoint_exporter.daemon.state import Source
from checkpoint_exporter.daemon.timers import JobDue
from checkpoint_exporter.daemon.validator import RETRY_UNCHECKED_SECONDS


class Validation:
    """Jobs' timers, verdicts and correlation: a part of ``Scanner``
    (daemon/scanner.py), on the core thread, sharing its state."""

    def _schedule_job(self, name: str, now: float, wall: float) -> None:
        """Arm the job's timer for when its tracker (or its telemetry window) is next due."""
        job = self.tracker.jobs.get(name)
        if job is None:
            return
        due = job.next_due(wall)
        if self._correlating and job.last_window is not None:
            start, end = job.last_window
            done = job.window_telemetry
            if done is None or (done.start, done.end) != (start, end):
                ready = end + 1.5 * self.config.telemetry.sample_interval
                due = ready if due is None else min(due, ready)
        if due is None:
            self._timers.cancel(JobDue(name))
        else:  # on the monotonic clock; never in the past, so a timer cannot spin
            self._timers.at(JobDue(name), now + max(0.01, due - wall))

    def _job_due(self, name: str, now: float) -> None:
        job = self.tracker.jobs.get(name)
        source = self._sources.get(name)
        if job is None or source is None:
            return
        wall = self.clock()
        version = job.version
        job.tick(wall)
        if job.validation_retry_due(wall):
            for tier in source.tiers:
                self._timers.soon(tier.key, now)
        self._correlate(source, job, wall)
        if job.version != version:
            self._changed_jobs.add(name)
        self._schedule_job(name, now, wall)

    def _correlate(self, source: Source, job: JobTracker, wall: float) -> None:
        """Attach to the job's newest finished save what this node's devices did during it,
        once the samples after its end are in."""
        if not self._correlating or self.telemetry is None or job.last_window is None:
            return
        settle = 1.5 * self.config.telemetry.sample_interval
        start, end = job.last_window
        done = job.window_telemetry
        if (done is not None and (done.start, done.end) == (start, end)) or wall < end + settle:
            return
        disks = {tier.disk for tier in source.tiers if tier.disk}
        # The diagnosis (staging_bound) asks whether the network was quiet while training was
        # held before the payload moved: the same counters over that part of the window.
        stall = job.stall_window()
        held = None
        if stall is not None and stall[0] == start and stall[1] > start:
            held = self.telemetry.correlate(start, stall[1], disks).network_transmit_bytes
        job.set_window_telemetry(self.telemetry.correlate(start, end, disks), held)

    def _apply_verdicts(self) -> None:
        now, wall = self.monotonic(), self.clock()
        while True:
            try:
                request, verdict = self._verdicts.get_nowait()
            except queue.Empty:
                return
            job = self.tracker.jobs.get(request.job)
            source = self._sources.get(request.job)
            if job is None or source is None:
                continue
            if verdict is None:
                job.retry_validation(request)
                for tier in source.tiers:  # read again: the move shows up, or it is judged again
                    if tier.tier == request.tier:
                        self._timers.soon(tier.key, now)
            elif verdict.unchecked:
                job.retry_validation(request, wall + RETRY_UNCHECKED_SECONDS)
            else:
                job.apply_verdict(request, verdict)
            self._changed_jobs.add(request.job)
            self._schedule_job(request.job, now, wall)
