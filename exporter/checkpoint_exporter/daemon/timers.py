"""The core's timer queue: every deadline the daemon waits for, in one heap.

A key is due at one time at most: ``at`` sets (or moves) it, ``soon`` only ever brings it
forward. Moving a timer pushes a new heap entry and leaves the old one to be skipped when it
surfaces, so nothing ever walks the whole queue: the core sleeps until ``next_due`` and pays for
the timers that are due, not for the jobs that have none.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class TimerQueue(Generic[K]):
    def __init__(self) -> None:
        self._due: dict[K, float] = {}
        self._heap: list[tuple[float, int, K]] = []
        self._order = itertools.count()  # ties in time pop in the order they were set

    def __len__(self) -> int:
        return len(self._due)

    def at(self, key: K, due: float) -> None:
        """``key`` is due at ``due`` (and no longer at any earlier or later time)."""
        if self._due.get(key) == due:
            # Its entry is in the heap already: a second one would survive every compaction
            # (both match), and a key set again and again at one time made each ``at`` a walk
            # of the whole heap.
            return
        self._due[key] = due
        heapq.heappush(self._heap, (due, next(self._order), key))
        if len(self._heap) > 2 * len(self._due) + 64:  # too many moved entries: drop them
            self._heap = [(d, n, k) for d, n, k in self._heap if self._due.get(k) == d]
            heapq.heapify(self._heap)

    def soon(self, key: K, due: float) -> None:
        """``key`` is due at ``due`` unless it already is sooner."""
        current = self._due.get(key)
        if current is None or due < current:
            self.at(key, due)

    def cancel(self, key: K) -> None:
        self._due.pop(key, None)

    def due_at(self, key: K) -> float | None:
        return self._due.get(key)

    def next_due(self) -> float | None:
        heap = self._heap
        while heap and self._due.get(heap[0][2]) != heap[0][0]:
            heapq.heappop(heap)  # moved or cancelled since
        return heap[0][0] if heap else None

    def pop_due(self, now: float) -> list[K]:
        """The keys due by ``now``, earliest first; each is removed."""
        due, heap = [], self._heap
        while heap and heap[0][0] <= now:
            when, _, key = heapq.heappop(heap)
            if self._due.get(key) == when:
                del self._due[key]
                due.append(key)
        return due


# --- the core's timer keys -------------------------------------------------------------------


@dataclass(frozen=True)
class ScanDue:
    """A tier's next read."""

    job: str
    tier: str


@dataclass(frozen=True)
class JobDue:
    """The job's own timer (its tracker's next_due, or its telemetry window to correlate)."""

    job: str


@dataclass(frozen=True)
class StuckCheck:
    """Whether the mount's worker still makes progress."""

    mountpoint: str


@dataclass(frozen=True)
class ProbeDue:
    """A statvfs of a mount behind watched tiers: its capacity, and that it still answers."""

    mountpoint: str


@dataclass(frozen=True)
class DiscoverDue:
    """A discover root's next listing (its index in the configuration)."""

    index: int


@dataclass(frozen=True)
class Periodic:
    """A timer of the daemon's own, one of the constants below."""

    name: str


SPOOL_POLL = Periodic("spool")
RECONCILE = Periodic("reconcile")
NODE_REFRESH = Periodic("node")
HEALTH_REFRESH = Periodic("health")

TimerKey = ScanDue | JobDue | StuckCheck | ProbeDue | DiscoverDue | Periodic
