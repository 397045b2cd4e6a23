"""The save ledger: one record per save, updated by the disk's evidence and the ranks' events,
counted exactly once when it ends (committed: histograms and deadline counters; aborted: the
abort counter), keyed by the save's step or path (core/clocks.py ``save_key``).

What the ledger knows of a save is one entry (``Save``) in one bounded map (``_saves``, the
``COUNTED_KEYS`` saves last written to), which every path through here reads and updates:

- its end is accounted when its ranks' timeline settles, or by the disk's commit alone when
  none is open (its events not read yet); ``_first_account`` is the one place that says whether
  an account is the first, which counts it, or the second (the ranks' events read after the
  disk's commit), which replaces the record's phases and counts nothing. The disk's commit of a
  save already accounted adds to saves_committed only;
- a key outlives its save: a fixed name saved again (``last.ckpt``, a fixed checkpoint_id), a
  step saved again after a roll-back. An account is of a new save under the key when the same
  evidence already accounted it, or when its window lies apart from the accounted one (beyond
  the storage clock's tolerated skew); that save starts a fresh entry and counts;
- an abort is counted once whether the ranks or the disk report it first (``aborted``, cleared
  when a commit under the key ends that failure: the next abort under it counts again);
- its record, shown on the landing page and marked by restores, while it is one of the
  ``RECENT`` saves in ``recent_saves``.

The ranks' own evidence stays in their ``Timeline`` (core/clocks.py) until it settles.
"""

from __future__ import annotations

import bisect
import logging
from collections import OrderedDict, deque
from dataclasses import dataclass, field, replace

from checkpoint_exporter.core.base import JobBase
from checkpoint_exporter.core.clocks import SaveKey, Timeline
from checkpoint_exporter.core.diagnosis import overlaps
from checkpoint_exporter.core.generations import Gen
from checkpoint_exporter.core.skew import skew_tolerance
from checkpoint_exporter.model import (
    ABORTED,
    COMMITTED,
    STAGING,
    WRITING,
    HistogramState,
    SaveRecord,
    WindowTelemetry,
    disk_total,
)

# The parts of a JobTracker log as the tracker did before it was split (logger=core.tracker).
log = logging.getLogger("checkpoint_exporter.core.tracker")

# Save-duration buckets in seconds, few because every job and phase multiplies them; each job
# adds its own deadline, the boundary its SLO counts against.
DURATION_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600)
RECENT = 12  # saves and restores each job remembers for the landing page
COUNTED_KEYS = 256  # saves (and restored generations) whose counted symptoms are remembered


class Histogram:
    def __init__(self, bounds: tuple[float, ...]):
        self.bounds = tuple(sorted(set(bounds)))
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def state(self) -> HistogramState:
        return HistogramState(self.bounds, tuple(self.counts), self.sum)


# The evidence that accounts a save's end.
DISK = "disk"  # its commit on the durable tier
RANKS = "ranks"  # its ranks' timeline from the spool


@dataclass
class Save:
    """What the ledger remembers of the latest save under one key."""

    # Which evidence accounted its end (counted at the first, if it ended while we ran).
    accounted_by: set[str] = field(default_factory=set)
    window: tuple[float, float] | None = None  # its span as first accounted, on our clock
    aborted: bool = False  # an abort was counted under its key, and no commit came since
    abort_span: tuple[float, float] | None = None  # that abort's start and last write
    record: SaveRecord | None = None  # its finished record (an abort's is in recent_saves only)

    @property
    def accounted(self) -> bool:
        return bool(self.accounted_by)


@dataclass(eq=False)
class SaveLedger(JobBase):
    """Every save's record and the counters it feeds."""

    saves_committed: int = 0
    saves_aborted: int = 0
    deadline_misses: int = 0
    saves_within_deadline: int = 0
    durations: dict[str, Histogram] = field(default_factory=dict)
    last_phases: dict[str, float] = field(default_factory=dict)
    last_write_end: float | None = None
    last_write_step: int | None = None  # the step of the save last_write_end is of
    last_write_spread: float | None = None
    last_window: tuple[float, float] | None = None  # the newest finished save: start, commit
    window_telemetry: WindowTelemetry | None = None
    recent_saves: deque[SaveRecord] = field(default_factory=lambda: deque(maxlen=RECENT))
    # Every save's entry, by key, the one last written to last: the oldest is forgotten past
    # COUNTED_KEYS (a save's two accounts come within its timeline's expiry, far fewer saves).
    _saves: OrderedDict[SaveKey, Save] = field(default_factory=OrderedDict)

    def _entry(self, key: SaveKey) -> Save:
        """The save's entry, made if new, as the newest; the oldest beyond the bound go."""
        entry = self._saves.get(key)
        if entry is None:
            entry = self._saves[key] = Save()
        self._saves.move_to_end(key)
        while len(self._saves) > COUNTED_KEYS:
            self._saves.popitem(last=False)
        return entry

    def _known(self, key: SaveKey | None) -> Save | None:
        """The save's entry, if the ledger still has one; nothing is made."""
        return self._saves.get(key) if key is not None else None

    def _first_account(
        self, key: SaveKey | None, by: str, window: tuple[float, float] | None
    ) -> bool:
        """Mark the save's end accounted by ``by``: True the first time, the account that counts
        it; False for the other one (the disk's commit and its ranks' timeline end the same
        save)."""
        if key is None:
            return True  # nothing to join a second account to
        entry = self._entry(key)
        if entry.accounted and not self._same_save(entry, by, window):
            # A new save under a key that outlived the last one: a fresh entry, counted afresh.
            entry.accounted_by, entry.window, entry.record = set(), None, None
            self._counted.pop(key, None)
        first = not entry.accounted
        entry.accounted_by.add(by)
        entry.window = entry.window or window
        return first

    def _same_save(self, entry: Save, by: str, window: tuple[float, float] | None) -> bool:
        """Whether an account by ``by`` over ``window`` is of the save ``entry`` accounted.
        The same evidence accounts a save once, so a second account by it is of the same save
        only while its span meets the first one's (a straggler's late events); the other
        evidence's span, on another clock, may lie apart by the tolerated skew."""
        if window is None:
            return True  # a piece of a save with no span of its own (a straggler's events)
        if entry.window is None:  # accounted without a span: only the other evidence joins it
            return by not in entry.accounted_by
        slack = 0.0 if by in entry.accounted_by else skew_tolerance(self.policy.poll_interval)
        return _meet(entry.window, window, slack)

    def _abort_counted(self, key: SaveKey | None) -> bool:
        """An abort under this key was counted, and no commit came since."""
        entry = self._known(key)
        return entry is not None and entry.aborted

    def _commit(self, gen: Gen) -> None:
        gen.state = COMMITTED
        self._superseded(gen)
        if not self._counts(gen):
            return
        key = self._save_key(gen)
        entry = self._known(key)
        if entry is not None:
            # An abort counted under this key is over: the next one under it counts again (a
            # fixed checkpoint_id, or a step saved again after a roll-back).
            entry.aborted = False
        self.saves_committed += 1
        commit = gen.found.commit_time or gen.found.last_write_time
        staged = self._gens.get((STAGING, gen.found.id))
        if staged is not None:  # a two-tier save started when its staging copy did
            gen.start_time = min(gen.start_time, staged.start_time)
        duration = disk_total(gen.start_time, commit)
        window = (self.local_time(gen.start_time), self.local_time(commit))
        if entry is not None and entry.accounted and self._same_save(entry, DISK, window):
            entry.accounted_by.add(DISK)
            return  # its events already told the whole story
        timeline = self.clocks.saves.get(key) if key else None
        if timeline is not None:
            # Its ranks know the phases, on this node's clock; the durable commit, moved onto
            # that clock, is where a two-tier save ends.
            timeline.disk_total, timeline.durable_commit = duration, self.local_time(commit)
            return  # the next tick settles it
        self._account({"total": duration}, live=True, key=key, by=DISK, window=window)

    def _account(
        self, phases: dict[str, float], live: bool, key: SaveKey | None, by: str,
        timeline: Timeline | None = None, window: tuple[float, float] | None = None,
    ) -> None:  # fmt: skip
        """One finished save: its phases set the gauges and, if it ended while we ran, the
        histograms and the deadline count.

        ``live``: it ended while we ran. Its histograms and deadline counters count it at its
        first account only (``_first_account``); its symptoms at each (once per save and
        symptom by ``_mark``, so the ranks' account after the disk's still counts what only the
        ranks reveal, a straggler)."""
        window = timeline.window() if timeline is not None else window
        if window is not None and window != self.last_window:
            self.last_window, self.window_telemetry = window, None
        first = self._first_account(key, by, window)
        self.last_phases = dict(phases)
        if timeline is not None:
            self.last_write_end = timeline.write_end()
            self.last_write_spread = timeline.write_spread()
            # Which save that write end is of: cross-node rules compare only the nodes that
            # wrote the job's newest save (a node the job left still shows its last one).
            step = timeline.key[1] if timeline.key[0] == "step" else None
            self.last_write_step = step if isinstance(step, int) else None
        if window is not None:
            late = phases.get("total", 0.0) > self.policy.deadline
            step = key[1] if key is not None and key[0] == "step" else None
            record = SaveRecord(
                step if isinstance(step, int) else None, window[0], window[1],
                tuple(sorted(phases.items())), "late" if late else "ok",
            )  # fmt: skip
            record = self._remember(record, key, again=not first)
            self._await_diagnosis(record, key, live, phases, timeline, window)
        if not (live and first):
            return
        for phase, seconds in phases.items():
            self.durations[phase].observe(seconds)
        # Every observed total is one or the other, so the two counters sum to the histogram's
        # total count and an SLO ratio needs no bucket series.
        total = phases.get("total")
        if total is None:
            return
        if total > self.policy.deadline:
            self.deadline_misses += 1
        else:
            self.saves_within_deadline += 1

    def _remember(self, record: SaveRecord, key: SaveKey | None, again: bool) -> SaveRecord:
        """Add a finished save to the recent ones. Accounted again (the disk's commit first,
        its ranks' events later), the same save's earlier record is replaced by this fuller
        one, keeping what a restore found since (their windows overlap, give or take the
        storage clock's tolerated skew: a new save under the same name, a path saved again, is
        a new record)."""
        entry = self._entry(key) if key is not None else None
        previous = entry.record if entry is not None and again else None
        slack = skew_tolerance(self.policy.poll_interval)
        if (
            previous is not None
            and any(r is previous for r in self.recent_saves)
            and overlaps(previous.start - slack, previous.end + slack, [(record.start, record.end)])
        ):
            kept = tuple(s for s in previous.symptoms if s == "unrestorable")
            record = replace(record, symptoms=kept)
            self._replace_record(previous, record)
            if self._pending is not None and self._pending.record is previous:
                self._pending = None  # superseded before its telemetry came
        else:
            self.recent_saves.append(record)
        if entry is not None:
            entry.record = record
        return record

    def _abort(self, gen: Gen, reason: str | None = None) -> None:
        gen.state, gen.last_commit = ABORTED, None
        if gen.history:
            return  # found so at start-up: the gauges say so, no counter grows from history
        found = gen.found
        key = self._save_key(gen) if self._counts(gen) else None
        if self._abort_counted(key):
            return  # its ranks' save_failed counted (and logged) it already
        log.warning(
            "save aborted: job=%s tier=%s generation=%s step=%s reason=%s",
            self.name, gen.tier, found.id, found.step, reason or "aborted by the writer",
        )  # fmt: skip
        if self._counts(gen):
            self._count_abort(key, gen.start_time, found.last_write_time, found.step)

    def _count_abort(self, key: SaveKey | None, start: float, end: float, step: int | None) -> None:
        self.saves_aborted += 1
        self.recent_saves.append(SaveRecord(step, start, end, (), "aborted"))
        if key is not None:
            entry = self._entry(key)
            entry.aborted, entry.abort_span = True, (start, end)

    def _save_failed(self, key: SaveKey, timeline: Timeline) -> None:
        """Every rank that started the save here ended it, and none committed: its ranks said
        it failed. Its generation on disk (if any) is aborted now, not after abort_after; a
        save that failed before writing anything is counted from its events alone."""
        reason = f"its ranks reported save_failed: {timeline.errors[-1] if timeline.errors else ''}"
        aborted = False
        for gen in list(self._gens.values()):
            if gen.state == WRITING and self._save_key(gen) == key:
                self._abort(gen, reason.rstrip(": "))
                aborted = aborted or self._counts(gen)
        self._still_writing()
        if aborted or not timeline.live or not self._counts_saves():
            return
        window = timeline.window()
        starts = [e["save_start"] for e in timeline.ranks.values() if "save_start" in e]
        ends = [ts for e in timeline.ranks.values() for ts in e.values()]
        start = window[0] if window else (min(starts) if starts else max(ends))
        entry = self._known(key)
        if entry is not None and entry.aborted and entry.abort_span is not None:
            slack = skew_tolerance(self.policy.poll_interval)
            if _meet(entry.abort_span, (start, max(ends)), slack):
                return  # the disk's abort of this very save (it stood still) counted it
        step = key[1] if key[0] == "step" and isinstance(key[1], int) else None
        log.warning(
            "save aborted: job=%s step=%s reason=%s", self.name, step, reason.rstrip(": ")
        )  # fmt: skip
        self._count_abort(key, start, max(ends), step)

    def _settle_saves(self, now: float) -> bool:
        """Account the saves whose ranks all reported, or that expired; whether any did."""
        settled = False
        two_tier = self._two_tier()
        expired = self._timeline_expiry()
        for key, timeline in list(self.clocks.saves.items()):
            if timeline.finished(now):
                pending = two_tier and timeline.committed and timeline.durable_commit is None
                if pending and now - timeline.first_seen <= expired:
                    continue  # the ranks committed to staging; the deadline is durable
                del self.clocks.saves[key]
                settled = True
                if not timeline.committed:
                    self._save_failed(key, timeline)
                else:
                    # Counted already when the disk showed the commit before any of its events
                    # (the spool behind): the ranks' account then sets the gauges only, and
                    # counts the symptoms only they reveal (``_mark`` counts each once a save).
                    self._account(timeline.phases(), timeline.live, key, RANKS, timeline)
            elif now - timeline.first_seen > expired:
                del self.clocks.saves[key]  # some rank never reported: fall back to the disk
                settled = True
                if timeline.disk_total is not None:
                    self._account(
                        {"total": timeline.disk_total}, timeline.live, key, RANKS, timeline
                    )
        return settled

    def _record_of(self, key: SaveKey | None) -> SaveRecord | None:
        """The remembered save a restore of ``key`` was of: the same step, or the same path."""
        if key is None:
            return None
        if key[0] == "step":
            return next((r for r in reversed(self.recent_saves) if r.step == key[1]), None)
        entry = self._known(key)
        record = entry.record if entry is not None else None
        remembered = record is not None and any(r is record for r in self.recent_saves)
        return record if remembered else None

    def _replace_record(self, old: SaveRecord, new: SaveRecord) -> None:
        """Put ``new`` where ``old`` is in the recent saves (and in its save's entry); the
        newest save's verdict follows it."""
        for index, other in enumerate(self.recent_saves):
            if other is old:
                self.recent_saves[index] = new
        for entry in self._saves.values():
            if entry.record is old:
                entry.record = new
        if self._newest_save() is new:
            self.last_save_symptoms = new.symptoms

    def _newest_save(self) -> SaveRecord | None:
        """The newest finished (not aborted) save: the one checkpoint_last_save_symptom_info
        describes."""
        return next((r for r in reversed(self.recent_saves) if r.outcome != "aborted"), None)


def _meet(a: tuple[float, float], b: tuple[float, float], slack: float) -> bool:
    """Whether two spans share a moment, give or take ``slack``."""
    return a[0] - slack <= b[1] and b[0] <= a[1] + slack
