"""The four clocks of a save, from spool events: pause, staging, write, commit (and total).

Per rank: pause = resume - save_start (what training feels); staging = staged - save_start;
write = written - staged; commit = committed - written; total = committed - save_start. Per job
each phase is the slowest local rank's: this node's exporter sees the ranks that run here, and
recording rules take the maximum across nodes.

A save is keyed by its step, or by its path when the job gives no step, and joins the generation
the scanner finds on disk by the same key. It is finished when every rank that started it on this
node reported ``committed`` or ``save_failed``. Restores are followed the same way.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable
from dataclasses import dataclass, field

from checkpoint_exporter.spool import Event

SaveKey = tuple[str, object]  # ("step", 1200) or ("path", "/ckpt/job/step-1200")
SETTLE_SECONDS = 0.5


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
        phase: max(0.0, events[end] - events[begin])
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
        return (
            bool(self.ranks)
            and now - self.last_arrival >= SETTLE_SECONDS
            and all("committed" in e or "save_failed" in e for e in self.ranks.values())
        )

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
            out["total"] = max(out.get("total", 0.0), self.durable_commit - window[0])
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

    @property
    def finished(self) -> bool:
        return bool(self.ranks) and all(
            "restore_done" in e or "restore_failed" in e for e in self.ranks.values()
        )

    @property
    def succeeded(self) -> bool:
        return self.finished and all("restore_done" in e for e in self.ranks.values())

    def duration(self) -> float:
        return max(
            max(0.0, e.get("restore_done", e.get("restore_failed", 0.0)) - e["restore_start"])
            for e in self.ranks.values()
            if "restore_start" in e
        ) if any("restore_start" in e for e in self.ranks.values()) else 0.0  # fmt: skip

    def done_at(self) -> float:
        return max(e.get("restore_done", 0.0) for e in self.ranks.values())


@dataclass
class Clocks:
    """Open saves and restores of one job, fed by spool events."""

    saves: dict[SaveKey, Timeline] = field(default_factory=dict)
    restores: dict[tuple[SaveKey | None, str], RestoreRun] = field(default_factory=dict)

    def add(self, events: Iterable[Event], now: float) -> None:
        for event in events:
            if event.event.startswith("restore"):
                self._restore(event, now)
            else:
                self._save(event, now)

    def _save(self, event: Event, now: float) -> None:
        key = save_key(event.step, event.path)
        if key is None:
            return  # neither step nor path: nothing to join it to
        timeline = self.saves.get(key)
        if timeline is None:
            timeline = self.saves[key] = Timeline(key, event.path, first_seen=now)
        rank = timeline.ranks.setdefault(event.rank, {})
        rank.setdefault(event.event, event.ts)  # the first report of a point wins
        timeline.live |= not event.history
        timeline.last_arrival = now
        if event.error:
            timeline.errors.append(event.error)

    def _restore(self, event: Event, now: float) -> None:
        # One restore per key and host: a restart reloads once per rank.
        key = (save_key(event.step, event.path), event.host)
        run = self.restores.get(key)
        if run is None or (run.finished and event.event == "restore_start"):
            run = self.restores[key] = RestoreRun(key[0], first_seen=now)
        run.ranks.setdefault(event.rank, {}).setdefault(event.event, event.ts)
        run.live |= not event.history
        if event.error:
            run.errors.append(event.error)
