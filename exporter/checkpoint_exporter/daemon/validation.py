"""The daemon's one call into a job's core (``JobTracker.apply``) and what it does with the
``Effects``: validations handed to the validators, tiers read again, the job's timer armed,
verdicts applied (unchecked generations asked again on the job's timer), a save's telemetry
window correlated once its samples are in."""

from __future__ import annotations

import queue

from checkpoint_exporter.core.inputs import Effects, Input, Tick, VerdictIn, WindowTelemetryIn
from checkpoint_exporter.daemon.state import Source
from checkpoint_exporter.daemon.timers import JobDue
from checkpoint_exporter.daemon.validator import RETRY_UNCHECKED_SECONDS
from checkpoint_exporter.sources.objects import ObjectTreeReader


class Validation:
    """Jobs' evidence into their trackers, and what comes back: a part of ``Scanner``
    (daemon/scanner.py), on the core thread, sharing its state. ``_apply`` is the daemon's one
    call into a job's core (``JobTracker.apply``); everything the daemon then does for the job
    (validations, re-reads, its timer, the telemetry window) follows from the ``Effects``."""

    def _apply(self, name: str, message: Input) -> Effects | None:
        """Hand the job's tracker one input and do what its effects ask (None: no such job)."""
        effects = self.tracker.apply(name, message)
        if effects is None:
            return None
        self._effects[name] = effects
        if effects.events_dropped:
            self._dropping.add(name)
        now = self.monotonic()
        source = self._sources.get(name)
        # Built only when needed: most inputs (an idle poll's read) ask for neither.
        wanted = effects.validations or effects.rescan
        tiers = {t.tier: t for t in source.tiers} if source is not None and wanted else {}
        for request in effects.validations:
            tier = tiers.get(request.tier)
            if tier is not None and tier.reader is not None:
                reader = tier.reader
                fetch = reader.fetch if isinstance(reader, ObjectTreeReader) else None
                self._validators[tier.worker].submit(
                    request, tier.path, reader.follow_root_symlink, reader.tree, fetch
                )
        for tier_name in effects.rescan:  # read again: the move shows up, or it is judged again
            if (tier := tiers.get(tier_name)) is not None:
                self._timers.soon(tier.key, now)
        if effects.changed:
            self._changed_jobs.add(name)
        self._schedule_job(name, now)
        return effects

    def _schedule_job(self, name: str, now: float) -> None:
        """Arm the job's timer for when its tracker (or its telemetry window) is next due."""
        effects = self._effects.get(name)
        due = effects.next_due if effects is not None else None
        if self._correlating and effects is not None and effects.correlate is not None:
            ready = effects.correlate[1] + 1.5 * self.config.telemetry.sample_interval
            due = ready if due is None else min(due, ready)
        if due is None:
            self._timers.cancel(JobDue(name))
        else:  # on the monotonic clock; never in the past, so a timer cannot spin
            self._timers.at(JobDue(name), now + max(0.01, due - self.clock()))

    def _job_due(self, name: str, now: float) -> None:
        source = self._sources.get(name)
        if source is None:
            return
        wall = self.clock()
        effects = self._apply(name, Tick(wall))
        if effects is not None:
            self._correlate(source, effects, wall)

    def _correlate(self, source: Source, effects: Effects, wall: float) -> None:
        """Attach to the job's newest finished save what this node's devices did during it,
        once the samples after its end are in."""
        if not self._correlating or self.telemetry is None or effects.correlate is None:
            return
        start, end = effects.correlate
        if wall < end + 1.5 * self.config.telemetry.sample_interval:
            return
        disks = {tier.disk for tier in source.tiers if tier.disk}
        # The diagnosis (staging_bound) asks whether the network was quiet while training was
        # held before the payload moved: the same counters over that part of the window.
        stall, held = effects.stall, None
        if stall is not None and stall[0] == start and stall[1] > start:
            held = self.telemetry.correlate(start, stall[1], disks).network_transmit_bytes
        telemetry = self.telemetry.correlate(start, end, disks)
        self._apply(source.name, WindowTelemetryIn(telemetry, wall, held))

    def _apply_verdicts(self) -> None:
        while True:
            try:
                request, verdict = self._verdicts.get_nowait()
            except queue.Empty:
                return
            wall = self.clock()
            retry_at = wall + RETRY_UNCHECKED_SECONDS
            self._apply(request.job, VerdictIn(request, verdict, wall, not_before=retry_at))
