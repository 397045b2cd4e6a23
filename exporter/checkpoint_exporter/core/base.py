"""What every part of a job's tracker shares: the job, its generations, its clocks.

JobTracker (core/tracker.py) is composed of parts, one module each (scan, validation, ledger,
restores, diagnosing, liveness, drain), each a dataclass holding its own fields over this base.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from checkpoint_exporter.config import Policy
from checkpoint_exporter.core.clocks import (
    Clocks,
    SaveKey,
    save_key,
)
from checkpoint_exporter.core.generations import Gen
from checkpoint_exporter.core.skew import StorageClock, skew_tolerance
from checkpoint_exporter.model import (
    DURABLE,
    STAGING,
    WRITING,
    WatchedPath,
)

# A save whose ranks never all report is given up after this long (or three deadlines).
SAVE_TIMELINE_EXPIRY = 3600.0
_VERSIONS = itertools.count(1)  # every JobTracker's versions, process-wide (see _touch)


@dataclass(eq=False)
class JobBase:
    """The job, its generations on every tier, its ranks' timelines and its storage clock."""

    name: str
    paths: tuple[WatchedPath, ...]
    policy: Policy
    layout: str = ""
    _gens: dict[tuple[str, str], Gen] = field(default_factory=dict)
    _scanned: set[str] = field(default_factory=set)  # the tiers read at least once
    clocks: Clocks = field(default_factory=Clocks)
    skew: StorageClock = field(default_factory=StorageClock)  # file mtimes against ours
    # Raised whenever anything the published state shows changes; the state is rebuilt (and
    # re-rendered) only when it moved, so an idle job costs nothing.
    version: int = field(default_factory=lambda: next(_VERSIONS))
    _writing: bool = False  # a generation is being written

    def _still_writing(self) -> None:
        """Recompute whether any generation is being written (after a state change)."""
        self._writing = any(gen.state == WRITING for gen in self._gens.values())

    def _touch(self) -> None:
        """Something the published state shows changed: it is rebuilt under a new version. One
        counter for the process, so a job removed and added again (a reload, discovery) never
        shows a version its predecessor had: the renderer would serve the old job's lines."""
        self.version = next(_VERSIONS)

    def _two_tier(self) -> bool:
        """Staging and durable tiers both read here. A process that reads only the staging tier
        (the durable one is shared, read by another process) never sees the durable commit: its
        saves end with their ranks' own commit, and it has no drain to follow."""
        read = {p.tier for p in self.paths if p.scanned}
        return {STAGING, DURABLE} <= read

    def _counts(self, gen: Gen) -> bool:
        # Save lifecycle counters follow the durable tier; the staging tier feeds drain metrics.
        return gen.tier == DURABLE

    def _counts_saves(self) -> bool:
        """The save counters are kept here: this process reads the job's durable tier."""
        return any(p.tier == DURABLE and p.scanned for p in self.paths)

    def _timeline_expiry(self) -> float:
        """A save whose ranks never all report is given up after this long."""
        return max(SAVE_TIMELINE_EXPIRY, 3 * self.policy.deadline)

    def _save_key(self, gen: Gen) -> SaveKey | None:
        """The key under which this generation's spool events are filed."""
        if gen.found.step is not None:
            return save_key(gen.found.step, None)
        path = self._path_of(gen)
        for key, timeline in self.clocks.saves.items():
            if timeline.matches_path(path):
                return key
        return save_key(None, path)

    def _path_of(self, gen: Gen) -> str:
        root = next((p.path for p in self.paths if p.tier == gen.tier), "")
        return f"{root.rstrip('/')}/{gen.found.id}"

    @property
    def storage_clock_skew(self) -> float | None:
        """The gauge: the storage clock's offset (core/skew.py)."""
        return self.skew.gauge

    def local_time(self, mtime: float) -> float:
        """A storage timestamp on this node's clock, once the offset is clearly more than the
        detection latency (telemetry windows and event timelines run on the local clock)."""
        return self.skew.local_time(mtime, skew_tolerance(self.policy.poll_interval))
