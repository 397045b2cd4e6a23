"""Is the job alive: its signs of life, its heartbeats, whether it said it finished."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from checkpoint_exporter.core.base import JobBase
from checkpoint_exporter.events import Event

# The parts of a JobTracker log as the tracker did before it was split (logger=core.tracker).
log = logging.getLogger("checkpoint_exporter.core.tracker")

# A heartbeat this long after a `finished` event is a new run of the job, not the other ranks of
# the one that finished winding down (each rank heartbeats until its process exits, and a process
# group may take minutes to tear down). The rules use the same grace across nodes.
FINISHED_GRACE = 600.0


@dataclass(frozen=True)
class Life:
    """What a tracker knew of its job's life, handed to the next tracker of the same job (a
    reload that changed the job's config makes a new tracker; the job did not start again)."""

    first_seen: float
    alive_at: float | None
    finished_at: float | None
    heartbeat_at: float | None


@dataclass(eq=False)
class Liveness(JobBase):
    """Wall clock: when this exporter started watching the job, the last sign of life (a
    heartbeat or any spool event of the job's own, a write in its tree), and when the job said
    it finished (cleared when it runs again)."""

    first_seen: float = field(default_factory=time.time)
    alive_at: float | None = None
    finished_at: float | None = None
    heartbeat_at: float | None = None  # the newest heartbeat: the job's process runs

    @property
    def finished(self) -> bool:
        """The job ended: it said so (and has not run since), or the config says so."""
        return self.policy.finished or self.finished_at is not None

    def life(self) -> Life:
        return Life(self.first_seen, self.alive_at, self.finished_at, self.heartbeat_at)

    def take_life(self, other: Life) -> None:
        """Carry over what an earlier tracker of the same job knew of its life."""
        self.first_seen = min(self.first_seen, other.first_seen)
        self.alive_at, self.finished_at = other.alive_at, other.finished_at
        self.heartbeat_at = other.heartbeat_at
        self._touch()

    def _sign_of_life(self, at: float, now: float) -> None:
        """The job did something at ``at`` (a tenant's clock: never later than now)."""
        at = min(at, now)
        if self.alive_at is None or at > self.alive_at:
            self.alive_at = at
            self._touch()

    def _runs_again(self, at: float, now: float) -> None:
        """A new save (or a restart) began at ``at``: a job that had finished runs again."""
        if self.finished_at is not None and min(at, now) > self.finished_at:
            log.info("job=%s runs again after it finished", self.name)
            self.finished_at = None
            self._touch()

    def _live_events(self, events: list[Event], now: float) -> None:
        """Heartbeats, ``finished`` and every event of the job's own (not a drill's) are signs
        of life; ``finished`` holds until the job saves, restores or heartbeats again after it
        (other ranks heartbeat for a moment while their processes exit: FINISHED_GRACE)."""
        for event in sorted((e for e in events if not e.drill), key=lambda e: e.ts):
            at = min(event.ts, now)
            self._sign_of_life(at, now)
            if event.event == "finished":
                if self.finished_at is None or at > self.finished_at:
                    self.finished_at = at
                    self._touch()
            elif event.event == "heartbeat":
                if self.heartbeat_at is None or at > self.heartbeat_at:
                    self.heartbeat_at = at
                if self.finished_at is not None:
                    self._runs_again(at - FINISHED_GRACE, now)
            elif event.event in ("save_start", "restore_start"):
                self._runs_again(at, now)
