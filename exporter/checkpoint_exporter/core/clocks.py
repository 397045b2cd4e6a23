"""The four clocks of a save, from spool events: pause, staging, write, commit (and total).

Per rank: pause = resume - save_start (what training feels); staging = staged - save_start;
write = written - staged; commit = committed - written; total = committed - save_start. Per job
each phase is the slowest local rank's: this node's exporter sees the ranks that run here, and
recording rules take the maximum across nodes.

A save is keyed by its step, or by its path when the job gives no step, and joins the generation
the scanner finds on disk by the same key. It is finished when every rank that started it on this
node reported ``committed`` or ``save_failed``. Restores are followed the same way.

Events are hostile (any user writes the spool), so what one job's events can hold is bounded:
at most ``MAX_OPEN_SAVES`` saves and ``MAX_OPEN_RESTORES`` restores are followed at once (a new
one evicts the oldest that never got past its start), ``MAX_RANKS`` ranks each, ``MAX_ERRORS``
error messages each. An event dated more than ``FUTURE_SLACK`` ahead of the local clock, or
before its own save's (restore's) start on the same rank, is refused. Every refusal and eviction
is counted in ``dropped`` by reason. Durations are clamped to ``[0, MAX_SECONDS]``: finite,
whatever the events say.
"""

from __future__ import annotations

import itertools
import math
import posixpath
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from checkpoint_exporter.events import FUTURE_SLACK, MAX_EVENT_AGE, Event

SaveKey = tuple[str, object]  # ("step", 1200) or ("path", "/ckpt/job/step-1200")
SETTLE_SECONDS = 0.5
MAX_OPEN_SAVES = 128  # saves followed at once per job (a two-tier save waits up to an hour)
MAX_OPEN_RESTORES = 32  # restores followed at once per job (one per host and generation)
MAX_RANKS = 128  # ranks of one save or restore on one node
MAX_ERRORS = 8  # error messages kept per save or restore (the newest)
EVICTION_SCAN = 16  # the oldest open saves looked at for the one to give up, when one must go
START_SLACK = 1.0  # seconds an event may precede its own start (clock steps): clamped to 0
MAX_SECONDS = MAX_EVENT_AGE  # no duration is longer than the oldest event the spool accepts


def bounded(value: float) -> float:
    """A duration as exported: finite, never negative, at most MAX_SECONDS."""
    if math.isnan(value) or value <= 0.0:
        return 0.0
    return min(value, MAX_SECONDS)  # +inf (1e308 - -1e308) too


def save_key(step: int | None, path: str | None) -> SaveKey | None:
    if step is not None:
        return ("step", step)
    if path:
        return ("path", posixpath.normpath(path))
    return None


def phases_of(events: dict[str, float]) -> dict[str, float]:
    """One rank's phase durations (seconds, never negative) from its event timestamps."""
    spans = {
        "pause": ("save_start", "resume"),
        "staging": ("save_start", "staged"),
        "write": ("staged", "written"),
        "commit": ("written", "committed"),
        "total": ("save_start", "committed"),
    }
    return {
        phase: bounded(events[end] - events[begin])
        for phase, (begin, end) in spans.items()
        if begin in events and end in events
    }


@dataclass
class Timeline:
    """One save as its ranks on this node reported it."""

    key: SaveKey
    path: str | None
    ranks: dict[int, dict[str, float]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    live: bool = False  # some event arrived while the exporter ran
    first_seen: float = 0.0  # local clock, as every time below that is not an event's own
    last_arrival: float = 0.0
    disk_total: float | None = None  # from the generation on disk, if it committed first
    durable_commit: float | None = None  # when the durable tier's copy committed

    def finished(self, now: float) -> bool:
        """Every rank that started here has ended, and no rank has spoken for a moment (a
        slower rank's start may still sit unread in another spool file)."""
        return self.ended and now - self.last_arrival >= SETTLE_SECONDS

    @property
    def ended(self) -> bool:
        """Every rank heard from so far reported its end."""
        return bool(self.ranks) and all(
            "committed" in e or "save_failed" in e for e in self.ranks.values()
        )

    @property
    def progress(self) -> int:
        """2: ended; 1: some rank got past its start; 0: nothing but starts."""
        if self.ended:
            return 2
        return int(any(len(e) > 1 or "save_start" not in e for e in self.ranks.values()))

    @property
    def committed(self) -> bool:
        return any("committed" in events for events in self.ranks.values())

    def phases(self) -> dict[str, float]:
        """Per phase, the slowest rank's duration; the total runs to the durable commit when a
        staging tier drained it there later."""
        out: dict[str, float] = {}
        for events in self.ranks.values():
            for phase, seconds in phases_of(events).items():
                out[phase] = max(out.get(phase, 0.0), seconds)
        window = self.window()
        if window is not None and self.durable_commit is not None:
            out["total"] = max(out.get("total", 0.0), bounded(self.durable_commit - window[0]))
        return out

    def write_end(self) -> float | None:
        """The last rank's end of writing: when this node's part of the save was on storage."""
        ends = [e.get("written", e.get("committed")) for e in self.ranks.values()]
        ends = [end for end in ends if end is not None]
        return max(ends) if ends else None

    def window(self) -> tuple[float, float] | None:
        """(first rank's start, last rank's commit or the durable commit): the save's span."""
        starts = [e["save_start"] for e in self.ranks.values() if "save_start" in e]
        ends = [e["committed"] for e in self.ranks.values() if "committed" in e]
        if self.durable_commit is not None:
            ends.append(self.durable_commit)
        return (min(starts), max(ends)) if starts and ends else None

    def write_spread(self) -> float | None:
        ends = [e["written"] for e in self.ranks.values() if "written" in e]
        return max(ends) - min(ends) if len(ends) > 1 else None

    def matches_path(self, generation_path: str) -> bool:
        if self.path is None:
            return False
        mine = posixpath.normpath(self.path)
        theirs = posixpath.normpath(generation_path)
        return (
            mine == theirs
            or theirs.endswith("/" + mine.lstrip("./"))
            or mine.endswith("/" + posixpath.basename(theirs))
        )


@dataclass
class RestoreRun:
    key: SaveKey | None
    ranks: dict[int, dict[str, float]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    live: bool = False
    first_seen: float = 0.0
    drill: bool = False  # a restore drill, not a training job loading its checkpoint

    @property
    def finished(self) -> bool:
        return bool(self.ranks) and all(
            "restore_done" in e or "restore_failed" in e for e in self.ranks.values()
        )

    @property
    def progress(self) -> int:
        """2: finished; 1: some rank got past its start; 0: nothing but starts."""
        if self.finished:
            return 2
        return int(any(len(e) > 1 or "restore_start" not in e for e in self.ranks.values()))

    @property
    def succeeded(self) -> bool:
        return self.finished and all("restore_done" in e for e in self.ranks.values())

    def duration(self) -> float:
        return max(
            (
                bounded(e.get("restore_done", e.get("restore_failed", 0.0)) - e["restore_start"])
                for e in self.ranks.values()
                if "restore_start" in e
            ),
            default=0.0,
        )

    def done_at(self) -> float:
        return max(e.get("restore_done", 0.0) for e in self.ranks.values())


@dataclass
class Clocks:
    """Open saves and restores of one job, fed by spool events."""

    saves: dict[SaveKey, Timeline] = field(default_factory=dict)
    restores: dict[tuple[SaveKey | None, str, bool], RestoreRun] = field(default_factory=dict)
    # Events refused and saves or restores given up, by reason: the job's own count, which the
    # daemon adds to the spool reader's when it publishes (spool_dropped).
    dropped: Counter[str] = field(default_factory=Counter)

    def add(self, events: Iterable[Event], now: float) -> None:
        for event in events:
            if not math.isfinite(event.ts) or event.ts > now + FUTURE_SLACK:
                self.dropped["future"] += 1
            elif event.event.startswith("restore"):
                self._restore(event, now)
            else:
                self._save(event, now)

    def _save(self, event: Event, now: float) -> None:
        key = save_key(event.step, event.path)
        if key is None:
            return  # neither step nor path: nothing to join it to
        timeline = self.saves.get(key)
        rank = timeline.ranks.get(event.rank) if timeline is not None else None
        if not self._in_order(event, rank, "save_start", timeline):
            return
        if timeline is None:
            self._evict(self.saves, MAX_OPEN_SAVES, "open_saves_cap")
            timeline = self.saves[key] = Timeline(key, event.path, first_seen=now)
        if rank is None:
            rank = timeline.ranks[event.rank] = {}
        rank.setdefault(event.event, event.ts)  # the first report of a point wins
        timeline.live |= not event.history
        timeline.last_arrival = now
        if event.error:
            _note(timeline.errors, event.error)

    def _restore(self, event: Event, now: float) -> None:
        # One restore per key and host: a restart reloads once per rank. A drill of the same
        # generation on the same host is a restore of its own.
        key = (save_key(event.step, event.path), event.host, event.drill)
        run = self.restores.get(key)
        if run is not None and run.finished and event.event == "restore_start":
            run = None  # a new restore of the same generation
        rank = run.ranks.get(event.rank) if run is not None else None
        if not self._in_order(event, rank, "restore_start", run):
            return
        if run is None:
            self.restores.pop(key, None)
            self._evict(self.restores, MAX_OPEN_RESTORES, "open_restores_cap")
            run = self.restores[key] = RestoreRun(key[0], first_seen=now, drill=event.drill)
        if rank is None:
            rank = run.ranks[event.rank] = {}
        rank.setdefault(event.event, event.ts)
        run.live |= not event.history
        if event.error:
            _note(run.errors, event.error)

    def _in_order(
        self, event: Event, rank: dict[str, float] | None, start: str,
        followed: Timeline | RestoreRun | None,
    ) -> bool:  # fmt: skip
        """Whether the event may join its rank: not before that rank's start, no start after
        that rank's other points, and no rank beyond MAX_RANKS."""
        if rank is None:
            if followed is not None and len(followed.ranks) >= MAX_RANKS:
                self.dropped["ranks_cap"] += 1
                return False
            return True
        if event.event == start:  # a repeated start is ignored below, not refused
            late = start not in rank and any(ts < event.ts - START_SLACK for ts in rank.values())
        else:
            late = start in rank and event.ts < rank[start] - START_SLACK
        if late:
            self.dropped["before_start"] += 1
        return not late

    def _evict(self, followed: dict, limit: int, reason: str) -> None:
        """Make room for one more. Given up first: the oldest that never got past its start (a
        flood of starts that never end is made of those), then the oldest still waiting for a
        rank, then the oldest; so that a job's own stream of junk does not push out a save
        under way, or one that ended and is about to be accounted."""
        while len(followed) >= limit:
            victim, least = None, 3
            for key in itertools.islice(followed, EVICTION_SCAN):  # oldest first
                progress = followed[key].progress
                if progress < least:
                    victim, least = key, progress
                    if progress == 0:
                        break
            del followed[victim]
            self.dropped[reason] += 1


def _note(errors: list[str], error: str) -> None:
    if len(errors) >= MAX_ERRORS:
        del errors[0]
    errors.append(error)
