"""Per-job state machines, fed by scans; published to scrapes as an immutable Snapshot.

One thread (the scanner) owns every tracker and calls ``publish``; scrapes read ``snapshot``, a
reference swapped atomically, so a scrape never waits for a scan and never sees half an update.

Counters count only what happens while the daemon runs: what the first scan of a tier finds
already committed or aborted is history and sets gauges only, so a restart never inflates a
``_total`` series. A save found in flight at start-up is counted when it ends.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import math
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field, replace

from checkpoint_exporter.config import Config, DiagnosisThresholds, JobConfig, Policy
from checkpoint_exporter.core.clocks import (
    SETTLE_SECONDS,
    Clocks,
    RestoreRun,
    SaveKey,
    Timeline,
    save_key,
)
from checkpoint_exporter.core.diagnosis import PastSave, SaveFacts, diagnose, overlaps, stall
from checkpoint_exporter.core.drain import DrainState, drain_state
from checkpoint_exporter.events import LIFE_EVENTS, SAVE_EVENTS, Event
from checkpoint_exporter.model import (
    ABORTED,
    COMMITTED,
    DELETING,
    DURABLE,
    PHASES,
    STAGING,
    SYMPTOMS,
    WRITING,
    DaemonState,
    FilesystemState,
    Found,
    Generation,
    HistogramState,
    JobState,
    RestoreRecord,
    SaveRecord,
    Snapshot,
    Verdict,
    WatchedPath,
    WindowTelemetry,
    newest_committed,
)

log = logging.getLogger(__name__)

# Save-duration buckets in seconds, few because every job and phase multiplies them; each job
# adds its own deadline, the boundary its SLO counts against.
DURATION_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600)
RECENT = 12  # saves and restores each job remembers for the landing page
SKEW_SAMPLES = 16  # changes whose mtime-versus-local-clock offsets estimate the storage's skew
SKEW_TOLERANCE = 2.0  # offsets this small are detection latency, not a clock to correct
# The skew gauge holds the largest offset seen this long (its alert needs 15 minutes), so one file
# dated far off is reported even after sixteen ordinary changes pushed it out of the estimate.
SKEW_HOLD = 3600.0
# A sample this far above the samples' median is one file's date, not the storage's clock: it is
# reported, never used to move other times onto the local clock.
SKEW_OUTLIER = 60.0
# A file dated further ahead is no clock at all (the spool refuses events this far ahead too):
# the gauge reports it, the estimate of the storage's offset never takes it.
SKEW_FUTURE = 300.0
# A save or restore whose ranks never all report is given up after this long.
SAVE_TIMELINE_EXPIRY = 3600.0
RESTORE_EXPIRY = 6 * 3600.0
# ``next_due`` answers just past a deadline, since the deadlines compare strictly.
TICK_MARGIN = 0.01
_VERSIONS = itertools.count(1)  # every JobTracker's versions, process-wide (see _touch)
COUNTED_KEYS = 256  # saves (and restored generations) whose counted symptoms are remembered
# A heartbeat this long after a `finished` event is a new run of the job, not the other ranks of
# the one that finished winding down (each rank heartbeats until its process exits, and a process
# group may take minutes to tear down). The rules use the same grace across nodes.
FINISHED_GRACE = 600.0
# A save whose ranks started here and never all reported is taken as holding the storage path
# (for the neighbours' contention diagnosis, and as in flight for the backlog one) for this many
# of its deadlines, or as long as its ranks still report: not the hour it is followed.
OPEN_SAVE_DEADLINES = 2.0
Spans = Callable[[str], list[tuple[float, float]]]  # other jobs' save spans, by job name


@dataclass
class _Pending:
    """A finished save waiting for its window's telemetry before it is diagnosed."""

    record: SaveRecord
    key: SaveKey | None
    live: bool
    facts: SaveFacts
    due: float  # local clock: diagnosed without telemetry from then on


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


@dataclass
class _Gen:
    found: Found
    tier: str
    state: str
    start_time: float
    progress_at: float  # local clock: when a change was last observed (skew-proof abort timer)
    history: bool  # already there at the first scan
    valid: bool | None = None
    invalid_reason: str | None = None
    validated: tuple[int, int, float] | None = None  # signature the verdict is for
    pending: tuple[int, int, float] | None = None  # signature submitted for validation
    step_inside: int | None = None  # read inside the generation by the validator
    retry_at: float = 0.0  # its checks could not run: not asked again before this
    # The commit marker's time when last seen committed (kept while its files go or change).
    committed_at: float | None = None
    # Local clock: when the generation was first seen, and (raw commit time, when that value was
    # first seen). A tenant's mtime is never published later than when the exporter saw it: a
    # file dated a year ahead cannot pin the newest generation, nor a save's start its age.
    found_at: float = 0.0
    commit_seen: tuple[float | None, float] = (None, 0.0)
    # A generation without a marker rewritten in place (save_pretrained into the same directory,
    # last.ckpt saved again): what it was when last committed, still shown as committed while
    # the new content settles, so no gauge blinks at every save. Dropped when the rewrite is
    # judged, or aborted (then nothing known restorable is left at that name).
    last_commit: Generation | None = None

    @property
    def signature(self) -> tuple[int, int, float]:
        return self.found.bytes, self.found.files, self.found.last_write_time

    @property
    def commit_time(self) -> float:
        # A generation without a marker committed when its last write ended.
        found = self.found
        return found.commit_time if found.commit_time is not None else found.last_write_time

    def still(self, now: float, settle: float) -> bool:
        """Unchanged for the settle period (a generation without a commit marker)."""
        return now - self.progress_at >= settle

    def seen(self, now: float) -> None:
        """Note when the current commit time was first seen (by the local clock)."""
        if self.found.commit_time != self.commit_seen[0]:
            self.commit_seen = (self.found.commit_time, now)

    def public(self) -> Generation:
        found = self.found
        # Published times: the tenant's mtimes, never later than when each was seen here.
        seen_commit = self.commit_seen[1] if found.commit_time is not None else self.progress_at
        return Generation(
            id=found.id,
            tier=self.tier,
            step=found.step if found.step is not None else self.step_inside,
            state=self.state,
            start_time=min(self.start_time, self.found_at),
            last_write_time=min(found.last_write_time, self.progress_at),
            commit_time=min(self.commit_time, seen_commit) if self.state == COMMITTED else None,
            bytes=found.bytes,
            files=found.files,
            valid=self.valid,
            invalid_reason=self.invalid_reason,
        )


@dataclass(frozen=True)
class Observed:
    """What one scan of a tier did: the committed generations to validate, and the ones this
    scan saw commit (their files were last statted mid-write: the core reads them once more,
    in full, and observes again)."""

    requests: list[ValidationRequest] = field(default_factory=list)
    just_committed: tuple[str, ...] = ()


@dataclass(frozen=True)
class ValidationRequest:
    job: str
    tier: str
    generation: str
    signature: tuple[int, int, float]
    found: Found


@dataclass
class JobTracker:
    """The lifecycle of every generation of one job, across its tiers."""

    name: str
    paths: tuple[WatchedPath, ...]
    policy: Policy
    layout: str = ""
    _gens: dict[tuple[str, str], _Gen] = field(default_factory=dict)
    _scanned: set[str] = field(default_factory=set)
    # Per tier, what the last scan could not read: a generation first seen once it became
    # readable is history, and no save behind it is aborted while it cannot be seen.
    _unreadable: dict[str, frozenset[str]] = field(default_factory=dict)
    _hidden_since: dict[str, float] = field(default_factory=dict)  # when that began, per tier
    saves_committed: int = 0
    saves_aborted: int = 0
    deadline_misses: int = 0
    saves_within_deadline: int = 0
    validation_failures: Counter[str] = field(default_factory=Counter)
    durations: dict[str, Histogram] = field(default_factory=dict)
    _just_committed: list[str] = field(default_factory=list)
    clocks: Clocks = field(default_factory=Clocks)
    last_phases: dict[str, float] = field(default_factory=dict)
    last_write_end: float | None = None
    last_write_step: int | None = None  # the step of the save last_write_end is of
    last_write_spread: float | None = None
    restores: int = 0
    restore_failures: int = 0
    restore_last_success: float | None = None
    restore_last_duration: float | None = None
    _accounted: OrderedDict[SaveKey, None] = field(default_factory=OrderedDict)
    # Raised whenever anything the published state shows changes; the state is rebuilt (and
    # re-rendered) only when it moved, so an idle job costs nothing.
    version: int = field(default_factory=lambda: next(_VERSIONS))
    _cached: JobState | None = None
    _writing: bool = False
    # The newest committed generation's last known verdict: while a newer one is validated, the
    # valid gauge keeps it rather than disappearing (a blinking gauge breaks `for:` and absent()).
    _last_verdict: bool | None = None
    _next_retry: float | None = None  # the soonest retry_at of a generation left unchecked
    last_window: tuple[float, float] | None = None  # the newest finished save: start, commit
    window_telemetry: WindowTelemetry | None = None
    drain: DrainState = field(default_factory=DrainState)
    staged_bytes: int = 0
    drained_bytes: int = 0
    lost_generations: int = 0
    recent_saves: deque[SaveRecord] = field(default_factory=lambda: deque(maxlen=RECENT))
    recent_restores: deque[RestoreRecord] = field(default_factory=lambda: deque(maxlen=RECENT))
    _staged_counted: dict[str, int] | None = None  # None until both tiers were scanned once
    # Newest mtime of each change minus the local time it was seen: the storage clock's offset
    # plus detection latency, so the largest recent sample is the best estimate of the offset.
    _skew_samples: deque[float] = field(default_factory=lambda: deque(maxlen=SKEW_SAMPLES))
    _skew_held: tuple[float, float] | None = None  # the largest offset lately, and when seen
    _skew_clock: float = 0.0  # the local time of the newest observation (SKEW_HOLD runs on it)
    _drained_counted: set[str] = field(default_factory=set)
    # Diagnosis (core/diagnosis.py): the thresholds and the other jobs' save spans come from the
    # Tracker; alone (a test, a tool) a job sees no neighbours.
    thresholds: DiagnosisThresholds = field(default_factory=DiagnosisThresholds)
    telemetry_grace: float | None = None  # None: thresholds.telemetry_grace
    neighbours: Spans | None = None
    last_save_symptoms: tuple[str, ...] = ()
    symptom_counts: Counter[str] = field(default_factory=Counter)
    _pending: _Pending | None = None
    # Per save (or restored generation) key, the symptoms already counted: a save accounted
    # twice (the disk's commit first, its ranks' events later) counts each symptom once.
    _counted: OrderedDict[object, set[str]] = field(default_factory=OrderedDict)
    # The record of each recent save, by key: a save accounted twice (the disk's commit first,
    # its ranks' events later) keeps one record, and a restore marks the save it was of.
    _records: OrderedDict[SaveKey, SaveRecord] = field(default_factory=OrderedDict)
    saves_timed: bool = False  # save events of the job were read from this node's spool
    # Liveness (wall clock): when this exporter started watching the job, the last sign of life
    # (a heartbeat or any spool event of the job's own, a write in its tree), and when the job
    # said it finished (cleared when it runs again).
    first_seen: float = field(default_factory=time.time)
    alive_at: float | None = None
    finished_at: float | None = None
    heartbeat_at: float | None = None  # the newest heartbeat: the job's process runs
    restore_drills: int = 0
    restore_drill_failures: int = 0
    # Saves the ranks reported failed (save_failed), by key: their generation on disk, if any,
    # is aborted at once and counted once.
    _failed_saves: OrderedDict[SaveKey, bool] = field(default_factory=OrderedDict)

    def __post_init__(self) -> None:
        self.layout = self.layout or self.policy.layout
        bounds = (*DURATION_BUCKETS, self.policy.deadline)
        self.durations = {phase: Histogram(bounds) for phase in PHASES}

    # --- scans ---------------------------------------------------------------------------

    def observe(
        self,
        tier: str,
        found: list[Found],
        now: float,
        unreadable: Collection[str] = (),
        layout: str | None = None,
    ) -> Observed:
        """Apply one scan of ``tier``: what to validate, and what just committed (``Observed``).

        ``layout``: the layout the scan detected (None when fixed by the config or not known
        yet); the durable tier's names the job's.
        ``unreadable`` names the relative paths the scan could not read ("" for the root): what
        is known below them stays as it was (a permission flipped for a moment is not a deletion
        followed by a burst of false commits), and nothing new is taken from them.
        """
        if tier == DURABLE and layout is not None and layout != self.layout:
            log.info("job=%s: layout detected as %s", self.name, layout)
            self.layout = layout
            self._touch()
        if unreadable and first_read_failed(tier, self._scanned, unreadable):
            return Observed()  # nothing known yet and nothing readable: the next read is the first
        first = tier not in self._scanned
        hidden_before = self._unreadable.get(tier, frozenset())
        hidden_since = self._hidden_since.get(tier, now)
        self._unreadable[tier] = frozenset(unreadable)
        if not unreadable:
            self._hidden_since.pop(tier, None)
        elif not hidden_before:
            self._hidden_since[tier] = now
        self._just_committed = []
        self._skew_clock = max(self._skew_clock, now)
        self._scanned.add(tier)
        changed = first
        seen = set()
        requests = []
        for item in found:
            key = (tier, item.id)
            if unreadable and _behind(item.id, unreadable):
                if key in self._gens:
                    seen.add(key)
                continue
            seen.add(key)
            gen = self._gens.get(key)
            if gen is None:
                # Behind what could not be read, and written before that began: it was there
                # all along, unseen (history); written since, it is a save like any other.
                history = first or (
                    bool(hidden_before)
                    and _behind(item.id, hidden_before)
                    and item.last_write_time < hidden_since
                )
                gen, changed = self._new(tier, item, now, history), True
                self._sign_of_life(item.last_write_time, now)
                if history:  # watched since before its first generation was written, at least
                    self.first_seen = min(self.first_seen, max(0.0, min(item.start_time, now)))
                else:
                    self._runs_again(item.start_time, now)
            elif item is not gen.found:  # the scanner passes the same Found while nothing moved
                if _written_to(gen.found, item):
                    self._sign_of_life(item.last_write_time, now)
                self._update(gen, item, now)
                changed = True
            if item.invalid and gen.state == COMMITTED and gen.validated != gen.signature:
                self._verdict(gen, Verdict(False, item.reason, "found by the layout"))
                changed = True
            elif self._settled(gen, now) and not gen.found.checks:
                self._judged(gen, Verdict(True))  # nothing structural to wait for
                changed = True
            elif self._needs_validation(gen, now):
                requests.append(ValidationRequest(self.name, tier, item.id, gen.signature, item))
        for key in [k for k in self._gens if k[0] == tier and k not in seen]:
            if unreadable and _behind(key[1], unreadable):
                continue  # not seen because it could not be read: kept as last known
            del self._gens[key]  # deleted (retention) or renamed away
            changed = True
        self._next_retry = min(
            (g.retry_at for g in self._gens.values() if g.retry_at > now and g.pending is None),
            default=None,
        )
        if changed:
            self._touch()
        self._writing = any(gen.state == WRITING for gen in self._gens.values())
        self._update_drain()
        # Newest first, so the generation a restore would pick is judged first.
        requests.sort(key=lambda r: r.found.commit_time or 0.0, reverse=True)
        return Observed(requests, tuple(self._just_committed))

    def _new(self, tier: str, item: Found, now: float, first: bool) -> _Gen:
        gen = _Gen(item, tier, item.state, item.start_time, now, history=first, found_at=now)
        gen.seen(now)
        gen.committed_at = item.commit_time if item.state == COMMITTED else None
        if not first or item.last_write_time - now > SKEW_FUTURE:
            # History says nothing of the clock, unless it is dated ahead of now.
            self._skew_sample(item.last_write_time - now, now)
        self._gens[(tier, item.id)] = gen
        if first and item.settles:
            # Found at start-up: judged at once if its files are already older than the settle
            # period (history either way), else once they stay still.
            if now - item.last_write_time >= self.policy.settle:
                gen.progress_at = now - self.policy.settle
            else:
                gen.history = False
        elif first:
            # History: final states set gauges only; a save whose own files stopped changing
            # longer than abort_after ago was abandoned before we started.
            if item.state == WRITING and now - item.last_write_time > self.policy.abort_seconds:
                gen.state = ABORTED
        elif item.state == COMMITTED:
            self._commit(gen)
        elif item.state == ABORTED:
            self._abort(gen, item.reason)
        if gen.state == COMMITTED and not item.checks and not item.invalid:
            gen.valid, gen.validated = True, gen.signature  # nothing structural to check
        return gen

    def _update(self, gen: _Gen, item: Found, now: float) -> None:
        moved = (item.bytes, item.files, item.last_write_time) != gen.signature
        # Retention's rmtree, marker first: files go and nothing comes. Only a generation with a
        # marker can be told this way; one without (a rewrite that truncates, then grows) is a
        # new save in progress.
        shrinking = not item.settles and (
            item.files < gen.found.files or item.bytes < gen.found.bytes
        )
        # rmtree removes entries in listing order, so shards may go while the marker stands: a
        # committed generation losing files is being deleted until it stays still for the settle
        # period (then it lost them for good, and is judged again), with a marker or without
        # (DeepSpeed's tags, a directory of safetensors): never a new save, whatever the order
        # and however often it is read meanwhile. Fewer bytes in as many files is a rewrite under
        # the old marker, or a single file written again in place: not a deletion.
        losing_files = item.files < gen.found.files
        growing = item.files > gen.found.files or item.bytes > gen.found.bytes
        # A newer marker over files all written since the last commit: the same name saved
        # again (dcp.save into a fixed checkpoint_id, the marker renamed over the old one; or a
        # generation deleted and saved anew), a new save to count. A marker rewritten alone (a
        # pointer written twice) is not.
        resaved = (
            gen.committed_at is not None
            and item.commit_time is not None
            and item.commit_time > gen.committed_at
            and item.start_time > gen.committed_at
        )
        before = gen.public() if gen.state == COMMITTED else None
        if moved:
            gen.progress_at = now
            if item.last_write_time != gen.found.last_write_time:
                self._skew_sample(item.last_write_time - now, now)
        gen.start_time = min(gen.start_time, item.start_time)
        gen.found = item
        gen.seen(now)
        if item.state == WRITING and gen.state in (COMMITTED, DELETING) and shrinking:
            gen.state, gen.last_commit = DELETING, None  # retention at work, marker first
        elif item.state == COMMITTED and gen.state in (COMMITTED, DELETING) and resaved:
            self._recommit(gen, item, now)
        elif gen.state in (COMMITTED, DELETING) and losing_files:
            gen.state, gen.last_commit = DELETING, None  # retention at work, shards first
        elif gen.state == DELETING and not (item.state == WRITING and growing):
            if (item.state == COMMITTED and growing) or self._still_after_losing_files(gen, now):
                # The marker is back (a rename, a restore), or the files are lost for good:
                # judged again, nothing new to count.
                gen.state = COMMITTED
            # else: still being deleted, however it is read meanwhile
        elif item.state == COMMITTED and gen.state != COMMITTED:
            self._commit(gen)
            self._just_committed.append(item.id)
            if not item.checks and not item.invalid:
                gen.valid, gen.validated = True, gen.signature
        elif item.state == ABORTED and gen.state == WRITING:
            self._abort(gen, item.reason)
        elif item.state == WRITING and (
            (gen.state == COMMITTED and (moved or not item.settles))
            or (gen.state == ABORTED and item.settles and moved)
            or (gen.state == DELETING and growing)  # written anew in place
        ):
            # The commit marker went away, or a generation without one changed after its
            # verdict: it is being written again (rewritten in place, copied over), a new save.
            gen.state, gen.history = WRITING, False
            gen.valid = gen.invalid_reason = gen.validated = gen.pending = None
            gen.progress_at = now
            gen.start_time = item.start_time if moved else gen.start_time
            if item.settles and before is not None:
                gen.last_commit = before
        elif item.settles and moved and gen.state == WRITING:
            gen.history = False  # it moved while we watched: a live save, counted when judged
        if gen.state == COMMITTED and item.commit_time is not None:
            gen.committed_at = item.commit_time

    def _still_after_losing_files(self, gen: _Gen, now: float) -> bool:
        """A generation whose marker stands (or that has none to lose), deleting since it lost
        files, unchanged since for the settle period: the files are lost, not being deleted."""
        return (
            gen.state == DELETING
            and (gen.found.state == COMMITTED or gen.found.settles)
            and now - gen.progress_at >= self.policy.settle
        )

    def _recommit(self, gen: _Gen, item: Found, now: float) -> None:
        """The generation was saved again under its own name: a new save, counted and judged
        afresh (its previous verdict stands on the gauge until the new one is known)."""
        gen.state, gen.history, gen.last_commit = WRITING, False, None
        gen.start_time, gen.progress_at = item.start_time, now
        gen.valid = gen.invalid_reason = gen.validated = gen.pending = None
        self._commit(gen)
        self._just_committed.append(item.id)
        if not item.checks and not item.invalid:
            gen.valid, gen.validated = True, gen.signature

    def tick(self, now: float) -> None:
        """Abort saves that made no progress for the deadline (measured on the local clock)."""
        if self._writing:
            for gen in self._gens.values():
                hidden = self._unreadable.get(gen.tier)
                if hidden and _behind(gen.found.id, hidden):
                    continue  # cannot be seen now: no progress is not evidence of an abort
                if gen.state == WRITING and self._stalled(gen, now):
                    reason = gen.invalid_reason or (
                        f"no progress for {self.policy.abort_seconds:g} s since its last write"
                    )
                    self._abort(gen, reason)
                    self._touch()
            self._writing = any(gen.state == WRITING for gen in self._gens.values())
        if (self.clocks.saves or self.clocks.restores) and self._settle(now):
            self._touch()
        if self._pending is not None and now >= self._pending.due:
            self._diagnose(None)  # its telemetry never came (none on this node, or too late)
        for gen in self._gens.values():
            if self._still_after_losing_files(gen, now):
                gen.state = COMMITTED  # judged again: its signature changed since its verdict
                self._next_retry = min(self._next_retry or now, now)  # a scan asks for it
                self._touch()

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
                if hidden and _behind(gen.found.id, hidden):
                    continue  # judged again once it can be seen (a scan is what changes it)
                limit = self._stall_limit(gen)
                if limit is not None:
                    due.append(gen.progress_at + limit + TICK_MARGIN)
        expired = max(SAVE_TIMELINE_EXPIRY, 3 * self.policy.deadline)
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

    def _two_tier(self) -> bool:
        """Staging and durable tiers both read here. A process that reads only the staging tier
        (the durable one is shared, read by another process) never sees the durable commit: its
        saves end with their ranks' own commit, and it has no drain to follow."""
        read = {p.tier for p in self.paths if p.scanned}
        return {STAGING, DURABLE} <= read

    def _counts(self, gen: _Gen) -> bool:
        # Save lifecycle counters follow the durable tier; the staging tier feeds drain metrics.
        return gen.tier == DURABLE

    def _commit(self, gen: _Gen) -> None:
        gen.state = COMMITTED
        self._superseded(gen)
        if not self._counts(gen):
            return
        # An abort counted under this key is over: the next one under it counts again (a fixed
        # checkpoint_id, or a step saved again after a roll-back).
        self._failed_saves.pop(self._save_key(gen), None)
        self.saves_committed += 1
        commit = gen.found.commit_time or gen.found.last_write_time
        staged = self._gens.get((STAGING, gen.found.id))
        if staged is not None:  # a two-tier save started when its staging copy did
            gen.start_time = min(gen.start_time, staged.start_time)
        duration = max(0.0, commit - gen.start_time)  # both mtimes: one clock, never negative
        key = self._save_key(gen)
        if key in self._accounted:
            return  # its events already told the whole story
        timeline = self.clocks.saves.get(key) if key else None
        if timeline is not None:
            # Its ranks know the phases, on this node's clock; the durable commit, moved onto
            # that clock, is where a two-tier save ends.
            timeline.disk_total, timeline.durable_commit = duration, self.local_time(commit)
            return  # the next tick settles it
        window = (self.local_time(gen.start_time), self.local_time(commit))
        self._account({"total": duration}, live=True, key=key, window=window)

    def _skew_sample(self, offset: float, now: float) -> None:
        if offset <= SKEW_FUTURE:
            self._skew_samples.append(offset)  # else a date, not a clock: reported, never used
        # Held: the largest offset ahead of the clock. A date far behind it is an old file copied
        # with its times (`cp -a`, `rsync -a`), not a clock: it goes by with the other samples.
        held = self._skew_held
        if offset > 0 and (held is None or offset >= held[0] or now - held[1] > SKEW_HOLD):
            self._skew_held = (offset, now)

    @property
    def storage_clock_skew(self) -> float | None:
        """The gauge: the offset of the recent changes, or the largest seen within SKEW_HOLD
        (one file dated far off is reported long enough for its alert)."""
        estimate = self._skew_estimate()
        held = self._skew_held
        if held is None or estimate is None or abs(held[0]) <= abs(estimate):
            return estimate
        return held[0] if held[1] >= self._skew_clock - SKEW_HOLD else estimate

    def _skew_estimate(self) -> float | None:
        """The storage clock's offset: the largest recent sample (detection latency only makes
        samples smaller), leaving out one far above the rest (a file's date, not a clock)."""
        samples = sorted(self._skew_samples)
        if not samples:
            return None
        median = samples[(len(samples) - 1) // 2]
        return max(sample for sample in samples if sample <= median + SKEW_OUTLIER)

    def local_time(self, mtime: float) -> float:
        """A storage timestamp on this node's clock, once the offset is clearly more than the
        detection latency (telemetry windows and event timelines run on the local clock)."""
        skew = self._skew_estimate()
        tolerance = max(SKEW_TOLERANCE, self.policy.poll_interval + 1.0)
        if skew is None or abs(skew) <= tolerance:
            return mtime
        return mtime - skew

    def _save_key(self, gen: _Gen) -> SaveKey | None:
        """The key under which this generation's spool events are filed."""
        if gen.found.step is not None:
            return save_key(gen.found.step, None)
        path = self._path_of(gen)
        for key, timeline in self.clocks.saves.items():
            if timeline.matches_path(path):
                return key
        return save_key(None, path)

    def _path_of(self, gen: _Gen) -> str:
        root = next((p.path for p in self.paths if p.tier == gen.tier), "")
        return f"{root.rstrip('/')}/{gen.found.id}"

    def _account(
        self, phases: dict[str, float], live: bool, key: SaveKey | None,
        timeline: Timeline | None = None, window: tuple[float, float] | None = None,
        diagnosed_live: bool | None = None,
    ) -> None:  # fmt: skip
        """One finished save: its phases set the gauges and, if it ended while we ran, the
        histograms and the deadline count.

        ``live``: counted in the histograms and deadline counters (once per save: not when the
        disk's commit already counted it). ``diagnosed_live`` (default ``live``): its symptoms
        are counted (once per save and symptom by ``_mark``, so the ranks' account after the
        disk's still counts what only the ranks reveal, a straggler)."""
        window = timeline.window() if timeline is not None else window
        if window is not None and window != self.last_window:
            self.last_window, self.window_telemetry = window, None
        again = key is not None and key in self._accounted
        if key is not None:
            self._accounted[key] = None
            while len(self._accounted) > 256:
                self._accounted.popitem(last=False)
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
            record = self._remember(record, key, again)
            symptoms_live = live if diagnosed_live is None else diagnosed_live
            self._await_diagnosis(record, key, symptoms_live, phases, timeline, window)
        if not live:
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
        previous = self._records.get(key) if key is not None and again else None
        slack = max(SKEW_TOLERANCE, self.policy.poll_interval + 1.0)
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
        if key is not None:
            self._records[key] = record
            self._records.move_to_end(key)
            while len(self._records) > RECENT:
                self._records.popitem(last=False)
        return record

    # --- drain -------------------------------------------------------------------------------

    def _update_drain(self) -> None:
        """Match the staging tier against the durable tier; count what changed while we ran."""
        if not self._two_tier():
            return
        publics = [gen.public() for gen in self._gens.values()]
        state = drain_state(
            (g for g in publics if g.tier == STAGING), (g for g in publics if g.tier == DURABLE)
        )
        staged, drained = state.staged or {}, state.drained or {}
        if self._staged_counted is None:
            if {STAGING, DURABLE} <= self._scanned:  # history: what was already there
                self._staged_counted = dict(staged)
                self._drained_counted = set(drained)
            self.drain = state
            return
        for gen_id, size in staged.items():
            counted = self._staged_counted.get(gen_id, 0)
            if size > counted:  # new, or grown since its final stat
                self.staged_bytes += size - counted
                self._staged_counted[gen_id] = size
        for gen_id, size in drained.items():
            if gen_id not in self._drained_counted:
                self._drained_counted.add(gen_id)
                self.drained_bytes += size
        waiting_before = set(self.drain.staged or {}) - set(self.drain.drained or {})
        for gen_id in waiting_before - set(staged):
            if gen_id not in drained and gen_id not in self._drained_counted:
                self.lost_generations += 1  # deleted from staging before reaching durable
        self.drain = state

    def set_window_telemetry(
        self, telemetry: WindowTelemetry, stall_network_bytes: float | None = None
    ) -> None:
        """What this node's devices did during the newest save; ``stall_network_bytes``: the
        network bytes sent while training was held before its payload moved (``stall_window``)."""
        self.window_telemetry = telemetry
        self._touch()
        pending = self._pending
        if pending is not None and (telemetry.start, telemetry.end) == (
            pending.facts.start,
            pending.facts.end,
        ):
            self._diagnose(telemetry, stall_network_bytes)

    # --- diagnosis (core/diagnosis.py) ---------------------------------------------------------

    def stall_window(self) -> tuple[float, float] | None:
        """The part of the save awaiting diagnosis during which training was held before its
        payload moved (the shorter of its pause and staging phases); None when not known."""
        pending = self._pending
        held = stall(pending.facts) if pending is not None else None
        if pending is None or held is None:
            return None
        return pending.facts.start, pending.facts.start + held

    def busy_spans(self) -> list[tuple[float, float]]:
        """When this job's saves held the storage path: finished saves, and saves in progress
        (open-ended), on the local clock. A save followed from its ranks' events whose ranks
        stopped reporting holds it only for a while (``_open_span``)."""
        spans = [(record.start, record.end) for record in self.recent_saves]
        for timeline in self.clocks.saves.values():
            span = self._open_span(timeline)
            if span is not None:
                spans.append(span)
        for gen in self._gens.values():
            if gen.state == WRITING and not gen.history:
                spans.append((self.local_time(gen.start_time), math.inf))
        return spans

    def _await_diagnosis(
        self, record: SaveRecord, key: SaveKey | None, live: bool, phases: dict[str, float],
        timeline: Timeline | None, window: tuple[float, float],
    ) -> None:  # fmt: skip
        """Hold the save until its window's telemetry is known (or the grace passed)."""
        if self._pending is not None and self._pending.key != key:
            self._diagnose(None)  # a newer save took the window: its telemetry will not come
        commit_tail = None
        if timeline is not None:
            written = [e["written"] for e in timeline.ranks.values() if "written" in e]
            committed = [e["committed"] for e in timeline.ranks.values() if "committed" in e]
            if written and committed:
                commit_tail = max(0.0, max(committed) - max(written))
        facts = SaveFacts(
            start=window[0], end=window[1], phases=dict(phases),
            deadline=self.policy.deadline,
            write_spread=timeline.write_spread() if timeline is not None else None,
            commit_tail=commit_tail, in_flight=self._in_flight(key, window[1]),
            synchronous=timeline is not None and _synchronous(timeline),
        )  # fmt: skip
        grace = (
            self.thresholds.telemetry_grace
            if self.telemetry_grace is None
            else self.telemetry_grace
        )
        self._pending = _Pending(record, key, live, facts, window[1] + grace)
        telemetry = self.window_telemetry
        if telemetry is not None and (telemetry.start, telemetry.end) == window:
            self._diagnose(telemetry)  # accounted again: its telemetry is already in

    def _open_span(self, timeline: Timeline) -> tuple[float, float] | None:
        """A save in progress from its ranks' events: from its first start to its deadline x
        ``OPEN_SAVE_DEADLINES`` later, or to its newest event if a rank still reports after
        that. One whose ranks were killed mid-save is followed for an hour before it is given
        up; open-ended all that time, every other job's slow save would read as contention."""
        starts = [e["save_start"] for e in timeline.ranks.values() if "save_start" in e]
        if not starts:
            return None
        start = min(starts)
        newest = max(ts for events in timeline.ranks.values() for ts in events.values())
        return start, max(start + OPEN_SAVE_DEADLINES * self.policy.deadline, newest)

    def _in_flight(self, key: SaveKey | None, at: float) -> int:
        """Other generations of the job still in flight at ``at``: being written on either
        tier, or committed on staging and not yet drained to the durable tier. The latter only
        where both tiers are read here: a process reading staging alone (the durable tier
        shared) sees every retained staged generation and none of their durable copies."""
        ids = set()
        for gen in self._gens.values():
            if key is not None and self._save_key(gen) == key:
                continue
            if gen.state == WRITING and not gen.history:
                ids.add(gen.found.id)
        if self._two_tier():
            drained = self.drain.drained or {}
            for gen_id in self.drain.staged or {}:
                gen = self._gens.get((STAGING, gen_id))
                if gen_id in drained or gen is None:
                    continue
                if key is None or self._save_key(gen) != key:
                    ids.add(gen_id)
        others = 0
        for other, timeline in self.clocks.saves.items():
            span = self._open_span(timeline)
            others += other != key and span is not None and span[1] >= at
        return max(len(ids), others)

    def _diagnose(
        self, telemetry: WindowTelemetry | None, stall_network_bytes: float | None = None
    ) -> None:
        pending, self._pending = self._pending, None
        if pending is None:
            return
        spans = self.neighbours(self.name) if self.neighbours is not None else []
        facts = pending.facts
        history, seen = [], {facts.start}
        for record in self.recent_saves:
            total = dict(record.phases).get("total")
            if record is pending.record or record.start in seen or total is None:
                continue  # itself, a save accounted twice, or an aborted one
            if record.start < facts.start:
                seen.add(record.start)
                # As judged when it was diagnosed: the neighbours' records of then are gone.
                history.append(PastSave(total, record.overlapped))
        overlapped = overlaps(facts.start, facts.end, spans)
        facts = replace(
            facts, window=telemetry, stall_network_bytes=stall_network_bytes,
            overlapped=overlapped, history=tuple(history),
        )  # fmt: skip
        symptoms = diagnose(facts, self.thresholds)
        record = pending.record
        if record.overlapped != overlapped:
            record = replace(record, overlapped=overlapped)
            self._replace_record(pending.record, record)
        self._mark(record, symptoms, pending.key, pending.live)

    def _mark(
        self, record: SaveRecord | None, symptoms: tuple[str, ...], key: object, live: bool
    ) -> None:
        """Add ``symptoms`` to a save's record (and to the newest save's verdict when it is that
        one), counting each once per save."""
        self._touch()
        if record is not None:
            merged = tuple(s for s in SYMPTOMS if s in symptoms or s in record.symptoms)
            self._replace_record(record, replace(record, symptoms=merged))
        if not live:
            return  # history sets the record, never a counter
        counted = self._counted.setdefault(key, set())
        self._counted.move_to_end(key)
        while len(self._counted) > COUNTED_KEYS:
            self._counted.popitem(last=False)
        for symptom in symptoms:
            if symptom not in counted:
                counted.add(symptom)
                self.symptom_counts[symptom] += 1

    def _newest_save(self) -> SaveRecord | None:
        """The newest finished (not aborted) save: the one checkpoint_last_save_symptom_info
        describes."""
        return next((r for r in reversed(self.recent_saves) if r.outcome != "aborted"), None)

    # --- liveness ----------------------------------------------------------------------------

    @property
    def finished(self) -> bool:
        """The job ended: it said so (and has not run since), or the config says so."""
        return self.policy.finished or self.finished_at is not None

    def take_life(self, other: JobTracker) -> None:
        """Carry over what an earlier tracker of the same job knew of its life (a reload that
        changed the job's config makes a new tracker; the job did not start again)."""
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

    # --- spool events ------------------------------------------------------------------------

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

    def set_paths(self, paths: tuple[WatchedPath, ...]) -> None:
        """How each tier is watched now (its mode, its filesystem), as the core decided."""
        if paths != self.paths:
            self.paths = paths
            self._touch()

    def _touch(self) -> None:
        """Something the published state shows changed: it is rebuilt under a new version. One
        counter for the process, so a job removed and added again (a reload, discovery) never
        shows a version its predecessor had: the renderer would serve the old job's lines."""
        self.version = next(_VERSIONS)

    def _settle(self, now: float) -> bool:
        """Account the spool timelines that ended or expired; whether any did."""
        settled = False
        two_tier = self._two_tier()
        expired = max(SAVE_TIMELINE_EXPIRY, 3 * self.policy.deadline)
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
                    live = timeline.live and key not in self._accounted
                    self._account(timeline.phases(), live, key, timeline, None, timeline.live)
            elif now - timeline.first_seen > expired:
                del self.clocks.saves[key]  # some rank never reported: fall back to the disk
                settled = True
                if timeline.disk_total is not None:
                    live = timeline.live and key not in self._accounted
                    self._account(
                        {"total": timeline.disk_total}, live, key, timeline, None, timeline.live
                    )
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

    def _record_of(self, key: SaveKey | None) -> SaveRecord | None:
        """The remembered save a restore of ``key`` was of: the same step, or the same path."""
        if key is None:
            return None
        if key[0] == "step":
            return next((r for r in reversed(self.recent_saves) if r.step == key[1]), None)
        record = self._records.get(key)
        remembered = record is not None and any(r is record for r in self.recent_saves)
        return record if remembered else None

    def _replace_record(self, old: SaveRecord, new: SaveRecord) -> None:
        """Put ``new`` where ``old`` is in the recent saves (and the key map); the newest
        save's verdict follows it."""
        for index, other in enumerate(self.recent_saves):
            if other is old:
                self.recent_saves[index] = new
        for key, other in self._records.items():
            if other is old:
                self._records[key] = new
        if self._newest_save() is new:
            self.last_save_symptoms = new.symptoms

    def _stalled(self, gen: _Gen, now: float) -> bool:
        limit = self._stall_limit(gen)
        return limit is not None and now - gen.progress_at > limit

    def _stall_limit(self, gen: _Gen) -> float | None:
        """Seconds without progress after which a save in progress is aborted; None: not now.

        abort_after, not the deadline: a save slower than its deadline is late (counted when it
        commits), and a slow commit writes nothing for a while before its marker appears."""
        if gen.found.settles:
            # Judged by its checks once still; a verdict under way is waited for (so is one
            # whose checks could not run: not judged is not aborted), and one that found it
            # incomplete stands only once abort_after passed without progress.
            if gen.pending == gen.signature or gen.retry_at:
                return None
            return max(self.policy.abort_seconds, self.policy.settle)
        return self.policy.abort_seconds

    def _abort(self, gen: _Gen, reason: str | None = None) -> None:
        gen.state, gen.last_commit = ABORTED, None
        if gen.history:
            return  # found so at start-up: the gauges say so, no counter grows from history
        found = gen.found
        key = self._save_key(gen) if self._counts(gen) else None
        if key is not None and self._failed_saves.get(key):
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
            self._failed_saves[key] = True
            while len(self._failed_saves) > COUNTED_KEYS:
                self._failed_saves.popitem(last=False)

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
        self._writing = any(gen.state == WRITING for gen in self._gens.values())
        if aborted or not timeline.live or not self._counts_saves():
            return
        window = timeline.window()
        starts = [e["save_start"] for e in timeline.ranks.values() if "save_start" in e]
        ends = [ts for e in timeline.ranks.values() for ts in e.values()]
        start = window[0] if window else (min(starts) if starts else max(ends))
        step = key[1] if key[0] == "step" and isinstance(key[1], int) else None
        log.warning(
            "save aborted: job=%s step=%s reason=%s", self.name, step, reason.rstrip(": ")
        )  # fmt: skip
        self._count_abort(key, start, max(ends), step)

    def _counts_saves(self) -> bool:
        """The save counters are kept here: this process reads the job's durable tier."""
        return any(p.tier == DURABLE and p.scanned for p in self.paths)

    def _superseded(self, newer: _Gen) -> None:
        """A newer save committed on the tier while an older one made no progress since before
        it started: the job moved on, the older save will never finish (a rank died mid-save
        and the job restarted): aborted now rather than after abort_after."""
        for gen in list(self._gens.values()):
            if gen is newer or gen.tier != newer.tier or gen.state != WRITING or gen.history:
                continue
            if self._stall_limit(gen) is None:
                continue  # its verdict is under way, or its checks could not run: not judged
            older, new = gen.found.step, newer.found.step
            if older is not None and new is not None and older >= new:
                continue
            if gen.found.last_write_time < newer.start_time:
                self._abort(gen, f"a newer save ({newer.found.id}) committed while it stood still")
        self._writing = any(gen.state == WRITING for gen in self._gens.values())

    # --- validation ------------------------------------------------------------------------

    def _settled(self, gen: _Gen, now: float) -> bool:
        """A generation without a commit marker, unchanged for the settle period, unjudged."""
        return (
            gen.state == WRITING
            and gen.found.settles
            and gen.still(now, self.policy.settle)
            and gen.validated != gen.signature
        )

    def _needs_validation(self, gen: _Gen, now: float) -> bool:
        if not gen.found.checks or gen.pending == gen.signature or now < gen.retry_at:
            return False
        if gen.state == COMMITTED:
            return gen.validated != gen.signature
        return self._settled(gen, now)

    def submitted(self, request: ValidationRequest) -> None:
        """The request is on its way: don't ask again for the same signature."""
        gen = self._gens.get((request.tier, request.generation))
        if gen is not None:
            gen.pending = request.signature

    def apply_verdict(self, request: ValidationRequest, verdict: Verdict) -> None:
        self._touch()
        gen = self._gens.get((request.tier, request.generation))
        if gen is None or gen.signature != request.signature:
            return  # gone, or changed since: a fresh request is already on its way
        if gen.state == WRITING and gen.found.settles:
            self._judged(gen, verdict)
            return
        self._verdict(gen, verdict)

    def _judged(self, gen: _Gen, verdict: Verdict) -> None:
        """A generation without a commit marker, still for the settle period, was checked: whole
        means committed (when its last write ended); incomplete stays a save in progress until
        the deadline passes without progress (a writer may pause between two chunks)."""
        gen.validated, gen.pending, gen.retry_at = gen.signature, None, 0.0
        if verdict.step is not None:
            gen.step_inside = verdict.step
        if not verdict.valid:
            gen.invalid_reason = verdict.reason
            return
        if gen.history:
            gen.state = COMMITTED  # history: gauges only
        else:
            self._commit(gen)
        gen.valid, gen.invalid_reason, gen.last_commit = True, None, None
        self._writing = any(g.state == WRITING for g in self._gens.values())

    def retry_validation(self, request: ValidationRequest, not_before: float = 0.0) -> None:
        """No verdict: the generation moved while it was read (ask again on the next scan), or
        its checks could not run (ask again at ``not_before``)."""
        gen = self._gens.get((request.tier, request.generation))
        if gen is not None and gen.pending == request.signature:
            gen.pending, gen.retry_at = None, not_before
            if not_before:
                self._next_retry = min(self._next_retry or not_before, not_before)

    def validation_retry_due(self, now: float) -> bool:
        """A generation left unchecked is due to be asked again (the scanner rescans it)."""
        if self._next_retry is None or now < self._next_retry:
            return False
        self._next_retry = None
        return True

    def _verdict(self, gen: _Gen, verdict: Verdict) -> None:
        first_verdict_of_history = gen.history and gen.validated is None
        gen.valid, gen.invalid_reason = verdict.valid, verdict.reason
        gen.validated, gen.pending, gen.retry_at = gen.signature, None, 0.0
        if verdict.step is not None:
            gen.step_inside = verdict.step
        if not verdict.valid and verdict.reason and not first_verdict_of_history:
            self.validation_failures[verdict.reason] += 1

    # --- views -----------------------------------------------------------------------------

    def hot_directories(self, tier: str) -> list[str]:
        """Generations being written on ``tier``: their files are re-statted while hot."""
        return [
            _listing_path(gen.found.id)
            for (t, _), gen in self._gens.items()
            if t == tier and gen.state == WRITING
        ]

    def has_saves_in_progress(self) -> bool:
        return self._writing

    def state(self) -> JobState:
        if self._cached is None or self._cached.version != self.version:
            self._cached = self._build_state()
        return self._cached

    def _build_state(self) -> JobState:
        state = self._job_state()
        newest = newest_committed(state)
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


def _synchronous(timeline: Timeline) -> bool:
    """Every local rank that reported both resumed training only once its payload was written
    (dcp.save and instrument.save; ``saving`` with resume() called after written())."""
    both = [e for e in timeline.ranks.values() if "resume" in e and "written" in e]
    return bool(both) and all(e["resume"] >= e["written"] for e in both)


def _listing_path(gen_id: str) -> str:
    """A generation's id as a path in the tier's listing (the root itself is "" there)."""
    return "" if gen_id == "." else gen_id


def _written_to(before: Found, after: Found) -> bool:
    """The job wrote to the generation between two reads: files or bytes grew, or its commit
    marker is newer. Not a directory's mtime alone, which a deletion in it moves too (a cron
    cleaning a dead job's tree is no sign that the job runs)."""
    newer_marker = (after.commit_time or 0.0) > (before.commit_time or 0.0)
    return after.files > before.files or after.bytes > before.bytes or newer_marker


def _behind(gen_id: str, unreadable: Collection[str]) -> bool:
    """Is a generation at, below or above a path the scan could not read?"""
    return any(
        not path or path == gen_id or gen_id.startswith(path + "/") or path.startswith(gen_id + "/")
        for path in unreadable
    )


def first_read_failed(tier: str, scanned: Collection[str], unreadable: Collection[str]) -> bool:
    """The tier was never read and its root cannot be: nothing to keep, nothing to learn."""
    return tier not in scanned and "" in unreadable


def job_paths(job: JobConfig) -> tuple[WatchedPath, ...]:
    paths = [WatchedPath(DURABLE, str(job.path))]
    if job.staging is not None:
        paths.append(WatchedPath(STAGING, str(job.staging)))
    return tuple(paths)


class Tracker:
    """Every job's tracker, and the published snapshot."""

    def __init__(self, config: Config):
        self.diagnosis = config.diagnosis
        # A save's diagnosis waits for its window's telemetry, correlated 1.5 samples after its
        # end: a slow sampler gets a longer grace.
        self.telemetry_grace = max(
            config.diagnosis.telemetry_grace, 3 * config.telemetry.sample_interval
        )
        self.jobs: dict[str, JobTracker] = {}
        for job in config.jobs:
            if config.serving.tracks(job.name):  # a shared-scope process: its shard's jobs only
                self.add(JobTracker(job.name, job_paths(job), job.policy))
        self.snapshot = Snapshot(daemon=DaemonState())
        self._published: dict[str, JobState] = {}  # in the order of ``jobs``

    def add(self, job: JobTracker) -> None:
        job.thresholds, job.telemetry_grace = self.diagnosis, self.telemetry_grace
        job.neighbours = self.spans_of_others
        self.jobs[job.name] = job

    def spans_of_others(self, name: str) -> list[tuple[float, float]]:
        """Every other job's save spans on this node (for the contention diagnosis)."""
        return [
            span for other, job in self.jobs.items() if other != name for span in job.busy_spans()
        ]

    def forget(self, name: str) -> None:
        self.jobs.pop(name, None)

    def publish(
        self,
        daemon: DaemonState | None = None,
        filesystems: tuple[FilesystemState, ...] | None = None,
        telemetry: tuple[tuple[str, bool], ...] | None = None,
        changed: Collection[str] | None = None,
        held: Collection[str] = (),
    ) -> Snapshot:
        """Swap in a new snapshot, or keep the current one when nothing changed (so a scrape
        can reuse what it rendered for it).

        ``changed``: the jobs added, removed or touched since the last publish (None: look at
        every job), so a publish costs what changed. ``held``: jobs whose published state stays
        as it was for now (their files are being read once more after a commit)."""
        current = self.snapshot
        daemon = daemon if daemon is not None else current.daemon
        filesystems = filesystems if filesystems is not None else current.filesystems
        telemetry = telemetry if telemetry is not None else current.telemetry
        moved = added = False
        if changed is None:
            for name in [n for n in self._published if n not in self.jobs]:
                del self._published[name]
                moved = True
        for name in self.jobs if changed is None else changed:
            job = self.jobs.get(name)
            if job is None:
                moved = self._published.pop(name, None) is not None or moved
                continue
            if name in held and name in self._published:
                continue
            state = job.state()
            if self._published.get(name) is not state:
                added = added or name not in self._published
                self._published[name] = state
                moved = True
        if added:  # kept in the order of ``jobs``
            self._published = {n: self._published[n] for n in self.jobs if n in self._published}
        if moved or (daemon, filesystems, telemetry) != (
            current.daemon,
            current.filesystems,
            current.telemetry,
        ):
            jobs = tuple(self._published.values()) if moved else current.jobs
            self.snapshot = Snapshot(jobs, daemon, filesystems, telemetry)
        return self.snapshot
