"""One generation's lifecycle: a pure state machine, and the record the tracker keeps of it.

``step(state, evidence) -> (state, happened)`` decides; the tracker (core/tracker.py) carries
out what happened (counts a commit, logs an abort, resets a rewritten generation's verdict).

The states are the ones a Generation publishes: writing, committed, deleting, aborted, and None
for a generation not seen yet. Two words the design uses are not states of their own:
*settling* is a writing generation without a commit marker that stood still for the settle
period (its checks then judge it: ``Judged``), and *invalid* is a verdict a generation carries
beside its state (a committed one stays committed; a settling one judged incomplete stays
writing). *Re-saved under the same name* is a transition (committed -> committed, counted again).
"""

from __future__ import annotations

import enum
from collections.abc import Collection
from dataclasses import dataclass

from checkpoint_exporter.model import ABORTED, COMMITTED, DELETING, WRITING, Found, Generation


class Happened(enum.Enum):
    """What a step means beyond the new state: what the tracker does about it."""

    NOTHING = "nothing"
    COMMITTED = "committed"  # a save ended: counted (on the durable tier) and timed
    RESAVED = "resaved"  # saved again under its own name: a new save, counted afresh
    ABORTED = "aborted"  # a save ended without a commit: counted once
    REWRITTEN = "rewritten"  # written again in place: a new save, its verdict forgotten
    DELETING = "deleting"  # retention at work: what it was when committed is dropped
    JUDGED_AGAIN = "judged_again"  # back to committed: nothing new to count
    LIVE = "live"  # a generation found at start-up moved while watched: a live save now
    INCOMPLETE = "incomplete"  # a settling generation judged incomplete: still writing


# --- evidence ------------------------------------------------------------------------------


@dataclass(frozen=True)
class FirstSight:
    """The generation appears in a read. ``history``: already there when the tier was first
    read (gauges only); ``abandoned``: a history save whose files stopped changing longer than
    abort_after ago."""

    found: str  # the state the layout read (writing, committed, aborted)
    history: bool = False
    settles: bool = False
    abandoned: bool = False


@dataclass(frozen=True)
class Reread:
    """A later read of a known generation, compared with the previous one."""

    found: str  # the state the layout read now
    settles: bool = False  # no commit marker: judged by its checks once still
    moved: bool = False  # bytes, files or newest mtime differ
    shrinking: bool = False  # with a marker: fewer files or bytes (rmtree, marker first)
    losing_files: bool = False  # fewer files (rmtree, shards first)
    growing: bool = False  # more files or bytes
    resaved: bool = False  # a newer marker over files all written since the last commit
    lost_for_good: bool = False  # deleting, marker standing (or none), still for settle


@dataclass(frozen=True)
class Stalled:
    """No progress for the stall limit (tick), or its ranks reported save_failed, or a newer
    save committed on the tier while it stood still."""

    reason: str = ""


@dataclass(frozen=True)
class StillAfterLoss:
    """Deleting, and unchanged for the settle period since it lost files (tick)."""


@dataclass(frozen=True)
class Judged:
    """A settling generation's checks came back (or it has none to wait for)."""

    whole: bool
    history: bool = False


Evidence = FirstSight | Reread | Stalled | StillAfterLoss | Judged


def step(state: str | None, evidence: Evidence) -> tuple[str | None, Happened]:
    """The next state of a generation in ``state`` given ``evidence``, and what happened."""
    if isinstance(evidence, FirstSight):
        return _first_sight(state, evidence)
    if state is None:
        return None, Happened.NOTHING  # unseen: only a read can show it
    if isinstance(evidence, Reread):
        return _reread(state, evidence)
    if isinstance(evidence, Stalled):
        return (ABORTED, Happened.ABORTED) if state == WRITING else (state, Happened.NOTHING)
    if isinstance(evidence, StillAfterLoss):
        if state == DELETING:
            return COMMITTED, Happened.JUDGED_AGAIN
        return state, Happened.NOTHING
    if state != WRITING:
        return state, Happened.NOTHING  # a verdict on a generation not settling changes no state
    if not evidence.whole:
        return WRITING, Happened.INCOMPLETE
    return COMMITTED, Happened.NOTHING if evidence.history else Happened.COMMITTED


def _first_sight(state: str | None, seen: FirstSight) -> tuple[str | None, Happened]:
    if state is not None:
        return state, Happened.NOTHING  # already known: a read of it is a Reread
    if seen.history:
        # History sets gauges only; a save abandoned before the exporter started is aborted.
        if not seen.settles and seen.found == WRITING and seen.abandoned:
            return ABORTED, Happened.NOTHING
        return seen.found, Happened.NOTHING
    if seen.found == COMMITTED:
        return COMMITTED, Happened.COMMITTED
    if seen.found == ABORTED:
        return ABORTED, Happened.ABORTED
    return seen.found, Happened.NOTHING


def _reread(state: str, read: Reread) -> tuple[str, Happened]:
    # The order matters: each rule is tried only where the ones above it did not apply.
    kept = state in (COMMITTED, DELETING)
    if read.found == WRITING and kept and read.shrinking:
        return DELETING, Happened.DELETING  # retention at work, marker first
    if read.found == COMMITTED and kept and read.resaved:
        return COMMITTED, Happened.RESAVED
    if kept and read.losing_files:
        return DELETING, Happened.DELETING  # retention at work, shards first
    if state == DELETING and not (read.found == WRITING and read.growing):
        if (read.found == COMMITTED and read.growing) or read.lost_for_good:
            return COMMITTED, Happened.JUDGED_AGAIN  # the marker is back, or the files are lost
        return DELETING, Happened.NOTHING  # still being deleted, however it reads meanwhile
    if read.found == COMMITTED and state != COMMITTED:
        return COMMITTED, Happened.COMMITTED
    if read.found == ABORTED and state == WRITING:
        return ABORTED, Happened.ABORTED
    if read.found == WRITING and (
        (state == COMMITTED and (read.moved or not read.settles))
        or (state == ABORTED and read.settles and read.moved)
        or (state == DELETING and read.growing)  # written anew in place
    ):
        return WRITING, Happened.REWRITTEN
    if read.settles and read.moved and state == WRITING:
        return WRITING, Happened.LIVE
    return state, Happened.NOTHING


# --- the record --------------------------------------------------------------------------------


@dataclass
class Gen:
    """What the tracker knows of one generation on one tier."""

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

    def lost_for_good(self, now: float, settle: float) -> bool:
        """Deleting since it lost files, its marker standing (or none to lose), unchanged since
        for the settle period: the files are lost, not being deleted."""
        return (
            self.state == DELETING
            and (self.found.state == COMMITTED or self.found.settles)
            and now - self.progress_at >= settle
        )

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


def reread(gen: Gen, item: Found, now: float, settle: float) -> Reread:
    """The evidence of a new read ``item`` of ``gen`` (read before ``gen`` takes it)."""
    before = gen.found
    # Retention's rmtree, marker first: files go and nothing comes. Only a generation with a
    # marker can be told this way; one without (a rewrite that truncates, then grows) is a new
    # save in progress.
    shrinking = not item.settles and (item.files < before.files or item.bytes < before.bytes)
    # A newer marker over files all written since the last commit: the same name saved again
    # (dcp.save into a fixed checkpoint_id, the marker renamed over the old one; or a generation
    # deleted and saved anew), a new save to count. A marker rewritten alone is not.
    resaved = (
        gen.committed_at is not None
        and item.commit_time is not None
        and item.commit_time > gen.committed_at
        and item.start_time > gen.committed_at
    )
    moved = (item.bytes, item.files, item.last_write_time) != gen.signature
    progress_at = now if moved else gen.progress_at
    lost = (
        gen.state == DELETING
        and (item.state == COMMITTED or item.settles)
        and now - progress_at >= settle
    )
    return Reread(
        found=item.state,
        settles=item.settles,
        moved=moved,
        shrinking=shrinking,
        # rmtree removes entries in listing order, so shards may go while the marker stands: a
        # committed generation losing files is being deleted until it stays still for the
        # settle period. Fewer bytes in as many files is a rewrite, not a deletion.
        losing_files=item.files < before.files,
        growing=item.files > before.files or item.bytes > before.bytes,
        resaved=resaved,
        lost_for_good=lost,
    )


def written_to(before: Found, after: Found) -> bool:
    """The job wrote to the generation between two reads: files or bytes grew, or its commit
    marker is newer. Not a directory's mtime alone, which a deletion in it moves too (a cron
    cleaning a dead job's tree is no sign that the job runs)."""
    newer_marker = (after.commit_time or 0.0) > (before.commit_time or 0.0)
    return after.files > before.files or after.bytes > before.bytes or newer_marker


def behind(gen_id: str, unreadable: Collection[str]) -> bool:
    """Is a generation at, below or above a path the scan could not read?"""
    return any(
        not path or path == gen_id or gen_id.startswith(path + "/") or path.startswith(gen_id + "/")
        for path in unreadable
    )


def listing_path(gen_id: str) -> str:
    """A generation's id as a path in the tier's listing (the root itself is "" there)."""
    return "" if gen_id == "." else gen_id
