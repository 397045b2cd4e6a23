"""Restores reported by the ranks: counted, remembered, and marked on the save they were of."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace

from checkpoint_exporter.core.base import JobBase
from checkpoint_exporter.core.clocks import RestoreRun
from checkpoint_exporter.core.ledger import RECENT
from checkpoint_exporter.model import (
    RestoreRecord,
)

RESTORE_EXPIRY = 6 * 3600.0  # a restore whose ranks never all report is given up after this long


@dataclass(eq=False)
class Restores(JobBase):
    """The job's restores (drills included)."""

    restores: int = 0  # every restore, drills included
    restore_failures: int = 0
    restore_drills: int = 0
    restore_drill_failures: int = 0
    restore_last_success: float | None = None
    restore_last_duration: float | None = None
    recent_restores: deque[RestoreRecord] = field(default_factory=lambda: deque(maxlen=RECENT))

    def _settle_restores(self, now: float) -> bool:
        """Account the restores that ended or expired; whether any did."""
        settled = False
        for key, run in list(self.clocks.restores.items()):
            if run.finished:
                del self.clocks.restores[key]
                settled = True
                self._restored(run)
            elif now - run.first_seen > RESTORE_EXPIRY:
                del self.clocks.restores[key]
                settled = True
                run.errors.append("no result reported")
                if run.live:
                    self.restores += 1
                    self.restore_failures += 1
                    self.restore_drills += run.drill
                    self.restore_drill_failures += run.drill
        return settled

    def _restored(self, run: RestoreRun) -> None:
        self.restore_last_duration = run.duration()
        ended = max(
            (e.get("restore_done", e.get("restore_failed", 0.0)) for e in run.ranks.values()),
            default=0.0,
        )
        reason = run.errors[-1] if run.errors else ""
        self.recent_restores.append(
            RestoreRecord(ended, run.succeeded, run.duration(), reason, run.drill)
        )
        if run.succeeded:
            self.restore_last_success = max(self.restore_last_success or 0.0, run.done_at())
        if run.live:
            self.restores += 1
            self.restore_failures += 0 if run.succeeded else 1
            if run.drill:
                self.restore_drills += 1
                self.restore_drill_failures += 0 if run.succeeded else 1
        if run.succeeded:
            self._restorable(run)
        else:
            self._unrestorable(run, ended)

    def _unrestorable(self, run: RestoreRun, ended: float) -> None:
        """A restore failed: counted once per generation however often its restores fail, and
        the save it was of, when remembered, is marked unrestorable (no other save is: a drill
        of an old generation says nothing of the newest)."""
        key = ("restore", run.key) if run.key is not None else ("restore", ended)
        self._mark(self._record_of(run.key), ("unrestorable",), key, run.live)

    def _restorable(self, run: RestoreRun) -> None:
        """A restore succeeded: the save it was of is no longer shown unrestorable (a failed
        drill from a transient error, passing now). Its counter stays: the failure happened."""
        record = self._record_of(run.key)
        if record is None or "unrestorable" not in record.symptoms:
            return
        kept = tuple(s for s in record.symptoms if s != "unrestorable")
        self._replace_record(record, replace(record, symptoms=kept))
        self._touch()
