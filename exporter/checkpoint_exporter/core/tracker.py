"""One job's core: what its tiers' reads, its ranks' events and its verdicts tell, as one
``apply(input) -> Effects``, and the ``JobState`` it publishes (core/jobs.py holds every job's).

Counters count only what happens while the daemon runs: what the first scan of a tier finds
already committed or aborted is history and sets gauges only, so a restart never inflates a
``_total`` series. A save found in flight at start-up is counted when it ends.

A JobTracker is composed of its parts, a module each: the reads of its tiers (scan, over the
state machine in generations), validation, the save ledger, restores, diagnosing, liveness and
drain; the storage clock (skew). This module keeps what ties them: the clock (tick, next_due),
the spool's events, and the published state.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace

from checkpoint_exporter.core.base import SAVE_TIMELINE_EXPIRY as SAVE_TIMELINE_EXPIRY
from checkpoint_exporter.core.clocks import SETTLE_SECONDS
from checkpoint_exporter.core.diagnosing import Diagnosing
from checkpoint_exporter.core.drain import Draining
from checkpoint_exporter.core.generations import behind
from checkpoint_exporter.core.inputs import (
    Effects,
    Input,
    PathsPlaced,
    SpoolEvents,
    Tick,
    TierRead,
    VerdictIn,
    WindowTelemetryIn,
)
from checkpoint_exporter.core.ledger import DURATION_BUCKETS, Histogram, SaveLedger
from checkpoint_exporter.core.liveness import FINISHED_GRACE as FINISHED_GRACE
from checkpoint_exporter.core.liveness import Liveness
from checkpoint_exporter.core.restores import RESTORE_EXPIRY, Restores
from checkpoint_exporter.core.scan import Scans
from checkpoint_exporter.core.scan import first_read_failed as first_read_failed
from checkpoint_exporter.core.skew import SKEW_HOLD as SKEW_HOLD
from checkpoint_exporter.core.validation import Observed as Observed
from checkpoint_exporter.core.validation import Validation
from checkpoint_exporter.core.validation import ValidationRequest as ValidationRequest
from checkpoint_exporter.events import LIFE_EVENTS, SAVE_EVENTS, Event
from checkpoint_exporter.model import (
    COMMITTED,
    DELETING,
    PHASES,
    SYMPTOMS,
    WRITING,
    JobState,
    WatchedPath,
)

# ``next_due`` answers just past a deadline, since the deadlines compare strictly.
TICK_MARGIN = 0.01


@dataclass
class JobTracker(Scans, Validation, SaveLedger, Restores, Diagnosing, Liveness, Draining):
    """The lifecycle of every generation of one job, across its tiers."""

    saves_timed: bool = False  # save events of the job were read from this node's spool
    _cached: JobState | None = None
    # The newest committed generation's last known verdict: while a newer one is validated, the
    # valid gauge keeps it rather than disappearing (a blinking gauge breaks `for:` and absent()).
    _last_verdict: bool | None = None

    def __post_init__(self) -> None:
        self.layout = self.layout or self.policy.layout
        bounds = (*DURATION_BUCKETS, self.policy.deadline)
        self.durations = {phase: Histogram(bounds) for phase in PHASES}

    def tick(self, now: float) -> None:
        """Abort saves that made no progress for the deadline (measured on the local clock);
        settle the spool's timelines; diagnose a save whose telemetry never came."""
        self._abort_stalled(now)
        if (self.clocks.saves or self.clocks.restores) and self._settle(now):
            self._touch()
        if self._pending is not None and now >= self._pending.due:
            self._diagnose(None)  # its telemetry never came (none on this node, or too late)
        self._judge_lost(now)

    def next_due(self, now: float) -> float | None:
        """When ``tick`` next has something to do (an abort deadline, a spool timeline to settle
        or give up) or a generation left unchecked is due again: None when nothing is pending,
        so an idle job costs nothing between events."""
        due = [] if self._next_retry is None else [self._next_retry]
        if self._writing:
            for gen in self._gens.values():
                if gen.state != WRITING:
                    continue
                hidden = self._unreadable.get(gen.tier)
                if hidden and behind(gen.found.id, hidden):
                    continue  # judged again once it can be seen (a scan is what changes it)
                limit = self._stall_limit(gen)
                if limit is not None:
                    due.append(gen.progress_at + limit + TICK_MARGIN)
        expired = self._timeline_expiry()
        two_tier = self._two_tier()
        for timeline in self.clocks.saves.values():
            # Committed to staging and waiting for the durable commit (_settle keeps it): only
            # the disk's commit or the expiry moves it, not the settle period over and over.
            waiting = two_tier and timeline.committed and timeline.durable_commit is None
            if timeline.ended and not waiting:
                due.append(timeline.last_arrival + SETTLE_SECONDS + TICK_MARGIN)
            due.append(timeline.first_seen + expired + TICK_MARGIN)
        for run in self.clocks.restores.values():
            due.append(run.first_seen + RESTORE_EXPIRY + TICK_MARGIN)
        if self._pending is not None:
            due.append(self._pending.due + TICK_MARGIN)
        for gen in self._gens.values():
            if gen.state == DELETING and (gen.found.state == COMMITTED or gen.found.settles):
                due.append(gen.progress_at + self.policy.settle + TICK_MARGIN)
        return min(due, default=None)

    def apply_events(self, events: Iterable[Event], now: float) -> None:
        events = list(events)
        self._live_events(events, now)
        if not self.saves_timed and any(e.event in SAVE_EVENTS for e in events):
            # Its ranks save on this node: from now on every symptom counter is exported, at 0
            # before this node's first diagnosis of it (increase() misses a series born at 1).
            self.saves_timed = True
        self.clocks.add([e for e in events if e.event not in LIFE_EVENTS], now)
        self._settle(now)
        self._touch()

    # --- one call ------------------------------------------------------------------------------

    def apply(self, message: Input) -> Effects:
        """Apply one input (core/inputs.py) and say what the daemon must do next."""
        version = self.version
        validations: tuple[ValidationRequest, ...] = ()
        rescan: tuple[str, ...] = ()
        if isinstance(message, TierRead):
            observed = self.observe(
                message.tier, list(message.found), message.now, message.unreadable, message.layout
            )
            validations = tuple(observed.requests)
            for request in validations:
                self.submitted(request)
        elif isinstance(message, SpoolEvents):
            self.apply_events(message.events, message.now)
        elif isinstance(message, VerdictIn):
            if message.verdict is None:
                self.retry_validation(message.request)
                rescan = (message.request.tier,)  # the move shows up, or it is judged again
            elif message.verdict.unchecked:
                self.retry_validation(message.request, message.not_before)
            else:
                self.apply_verdict(message.request, message.verdict)
        elif isinstance(message, Tick):
            self.tick(message.now)
            validations = tuple(self.due_validations(message.now))
            for request in validations:
                self.submitted(request)
        elif isinstance(message, WindowTelemetryIn):
            self.set_window_telemetry(message.telemetry, message.stall_network_bytes)
        elif isinstance(message, PathsPlaced):
            self.set_paths(message.paths)
        else:
            raise TypeError(f"not an input of the core: {message!r}")
        return self._effects(message.now, version, validations, rescan)

    def _effects(
        self, now: float, version: int, validations: tuple[ValidationRequest, ...],
        rescan: tuple[str, ...],
    ) -> Effects:  # fmt: skip
        window, done = self.last_window, self.window_telemetry
        awaiting = window is not None and (done is None or (done.start, done.end) != window)
        return Effects(
            validations=validations,
            rescan=rescan,
            hot=tuple((p.tier, tuple(self.hot_directories(p.tier))) for p in self.paths),
            saves_in_progress=self.has_saves_in_progress(),
            next_due=self.next_due(now),
            correlate=window if awaiting else None,
            stall=self.stall_window() if awaiting else None,
            changed=self.version != version,
            events_dropped=tuple(sorted(self.clocks.dropped.items())),
        )

    def set_paths(self, paths: tuple[WatchedPath, ...]) -> None:
        """How each tier is watched now (its mode, its filesystem), as the core decided."""
        if paths != self.paths:
            self.paths = paths
            self._touch()

    def _settle(self, now: float) -> bool:
        """Account the spool timelines that ended or expired; whether any did."""
        saves = self._settle_saves(now)
        return self._settle_restores(now) or saves

    def state(self) -> JobState:
        if self._cached is None or self._cached.version != self.version:
            self._cached = self._build_state()
        return self._cached

    def _build_state(self) -> JobState:
        state = self._job_state()
        newest = state.newest_committed
        if newest is None:
            return state
        if newest.valid is not None:
            self._last_verdict = newest.valid
        # While the newest is validated, its predecessor's verdict stands until its own is known.
        return replace(state, last_committed_valid=self._last_verdict)

    def _job_state(self) -> JobState:
        return JobState(
            name=self.name,
            layout=self.layout,
            paths=self.paths,
            interval_seconds=self.policy.interval,
            deadline_seconds=self.policy.deadline,
            retained_generations_limit=self.policy.retained_generations,
            restore_drill_max_age_seconds=self.policy.restore_drill_max_age,
            mtbf_seconds=self.policy.mtbf,
            abandon_after_seconds=self.policy.abandon_after,
            paging=self.policy.page,
            first_seen=self.first_seen,
            alive_at=self.alive_at,
            finished=self.finished,
            finished_at=math.inf if self.policy.finished else self.finished_at,
            heartbeat_at=self.heartbeat_at,
            generations=tuple(
                view
                for gen in self._gens.values()
                for view in (gen.public(), gen.last_commit)
                if view is not None
            ),
            saves_committed=self.saves_committed,
            saves_aborted=self.saves_aborted,
            deadline_misses=self.deadline_misses,
            saves_within_deadline=self.saves_within_deadline,
            validation_failures=tuple(sorted(self.validation_failures.items())),
            # An uninstrumented job has only the disk's total: its empty phases stay unexported.
            save_duration=tuple(
                (phase, self.durations[phase].state())
                for phase in PHASES
                if phase == "total" or self.durations[phase].count
            ),
            last_phases=tuple(sorted(self.last_phases.items())),
            last_save_symptoms=self.last_save_symptoms,
            save_symptoms=tuple((s, self.symptom_counts[s]) for s in SYMPTOMS),
            saves_timed=self.saves_timed,
            local_saves_in_progress=sum(
                1 for timeline in self.clocks.saves.values() if timeline.live and not timeline.ended
            ),
            last_write_end=self.last_write_end,
            last_write_step=self.last_write_step,
            last_write_spread=self.last_write_spread,
            restores=self.restores,
            restore_failures=self.restore_failures,
            restore_drills=self.restore_drills,
            restore_drill_failures=self.restore_drill_failures,
            restore_last_success=self.restore_last_success,
            restore_last_duration=self.restore_last_duration,
            window=self.window_telemetry,
            drain_backlog_bytes=self.drain.backlog_bytes,
            drain_backlog_generations=self.drain.backlog_generations,
            oldest_undrained_commit=self.drain.oldest_undrained_commit,
            staged_bytes=self.staged_bytes,
            drained_bytes=self.drained_bytes,
            lost_generations=self.lost_generations,
            recent_saves=tuple(self.recent_saves),
            recent_restores=tuple(self.recent_restores),
            storage_clock_skew=self.storage_clock_skew,
            version=self.version,
        )
