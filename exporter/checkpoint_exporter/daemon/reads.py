"""Reading tiers: watch events coalesced into reads, reads batched per worker and turn, their
results handed to the tracker, the next read scheduled (poll, hot re-read, retry)."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Collection, Sequence

from checkpoint_exporter.core.generations import listing_path
from checkpoint_exporter.core.inputs import TierRead
from checkpoint_exporter.daemon.messages import Read
from checkpoint_exporter.daemon.state import (
    STUCK_SECONDS,
    Source,
    Tier,
    contains,
)
from checkpoint_exporter.daemon.timers import StuckCheck
from checkpoint_exporter.model import COMMITTED
from checkpoint_exporter.sources import layouts
from checkpoint_exporter.sources.layouts.base import Options
from checkpoint_exporter.sources.listing import TreeReader
from checkpoint_exporter.sources.objects import ObjectTreeReader
from checkpoint_exporter.sources.watch import (
    INOTIFY,
    POLL,
)
from checkpoint_exporter.storage_url import is_object_url

log = logging.getLogger(__name__)

COALESCE_SECONDS = 0.1
# Files the watcher named per tier between two reads, re-statted on the next one. Past this many,
# the rest are left to the hot re-stat of saves in progress and to the markers' re-stat.
TOUCHED_PER_JOB = 4096
HOT_RESCAN_SECONDS = 1.0  # a job with a save in progress is read this often
# ... and in object storage, where every read is billed requests (a LIST, a ListMultipartUploads
# and a ListParts per open upload: about 100 a second for a 100-rank save read each second).
OBJECT_HOT_RESCAN_SECONDS = 5.0
# Polls fall due on ticks this far apart, so the jobs polled at one interval are read in one
# batch per tick rather than one thread wake-up each (at most this much later).
POLL_GRID = 0.25
# Listings of what just committed, per read: one, and one more should another generation commit
# meanwhile (its sizes too were last statted mid-write); past that, the next read states it.
RESTAT_ROUNDS = 2
_NONE: frozenset[str] = frozenset()  # what a read without errors could not read: shared


class Reads:
    """Tier reads asked for, sent and applied: a part of ``Scanner``
    (daemon/scanner.py), on the core thread, sharing its state."""

    def _on_changed(self, name: str, path: str) -> None:
        source = self._sources.get(name)
        if source is None:
            return
        now = self.monotonic()
        tiers = [t for t in source.tiers if contains(t.path, path)] or source.tiers
        for tier in tiers:
            if path.rstrip("/") == tier.path.rstrip("/"):
                # The root itself: a watch healed after the directory was removed or moved and
                # made again. Nothing reported what was written meanwhile, and a tree put back
                # with its old mtimes (cp -a, rsync -a) would pass a listing's checks: read all.
                self._want_full_read(tier, now)
                continue
            if len(tier.touched) < TOUCHED_PER_JOB:
                tier.touched.add(path)
            self._timers.soon(tier.key, now + COALESCE_SECONDS)

    def _on_overflowed(self, path: str | None) -> None:
        self._overflows += 1
        self._republish = True
        log.warning("inotify queue overflowed below %s: reconciling", path or "a watch")
        now = self.monotonic()
        for source in self._sources.values():
            for tier in source.tiers:
                if path is None or contains(tier.path, path) or contains(path, tier.path):
                    self._want_full_read(tier, now)

    def _on_lost(self, name: str, reason: str) -> None:
        """A job whose tree grew past the inotify limits is polled from now on."""
        source = self._sources.get(name)
        if source is None or self.watcher is None:
            return
        self.watcher.unwatch(name)
        now = self.monotonic()
        for tier in source.tiers:
            if tier.mode == INOTIFY:
                tier.mode, tier.reason = POLL, reason
            self._want_full_read(tier, now)  # what changed unwatched is found by a full read
        log.warning("job=%s: %s; polling instead", name, reason)
        self._publish_paths(source)

    def _want_full_read(self, tier: Tier, now: float) -> None:
        tier.reconcile_wanted += 1
        self._timers.soon(tier.key, now)

    def _scan_due(self, name: str, tier_name: str, now: float) -> None:
        source = self._sources.get(name)
        tier = next((t for t in source.tiers if t.tier == tier_name), None) if source else None
        if tier is not None and tier.place_failed and source is not None:
            if now < tier.retry_at:
                self._timers.soon(tier.key, tier.retry_at)
            else:
                self._submit_place(tier, source.policy)
            return
        if tier is None or tier.reader is None:
            return  # gone, or not placed yet (placing schedules its first read)
        if tier.pending or self._workers[tier.worker].stuck:
            tier.again = True  # read once the one under way (or stuck) returns
            return
        if now < tier.retry_at:
            self._timers.soon(tier.key, tier.retry_at)
            return
        self._submit_read(source, tier, now)

    def _submit_read(self, source: Source, tier: Tier, now: float) -> None:
        assert tier.reader is not None
        effects = self._effects.get(source.name)
        hot = list(dict(effects.hot).get(tier.tier, ())) if effects is not None else []
        reconcile = tier.reconcile_wanted
        force = reconcile > tier.reconcile_done
        touched = _below(tier.path, tier.touched) if tier.touched else ()
        if tier.touched:  # an idle poll's stays the same empty set
            tier.touched = set()
        tier.again = False
        tier.pending = True
        options = Options(verify_checksums=source.policy.verify_checksums)
        fixed = source.fixed_layout

        def read() -> Read:
            return _read_tier(tier, hot, force, reconcile if force else 0, touched, fixed, options)

        self._reads.setdefault(tier.worker, []).append((read, tier))
        self._timers.soon(StuckCheck(tier.worker), now + STUCK_SECONDS)

    def _send_reads(self) -> None:
        """Hand each worker the reads this turn asked of it as one task: a thread wakes once per
        turn, not once per tier (polls fall due together on the POLL_GRID)."""
        for mountpoint, reads in self._reads.items():
            readers = [tier.reader for _, tier in reads if tier.reader is not None]
            tiers = [tier for _, tier in reads]

            def progress(readers: list[TreeReader | ObjectTreeReader] = readers) -> int:
                return sum(_progress(reader) for reader in readers)

            def batch(reads: list[tuple[Callable[[], Read], Tier]] = reads) -> list[Read]:
                return [read() for read, _ in reads]

            def failed(error: Exception, tiers: list[Tier] = tiers) -> list[Read]:
                # Each tier's read failed: read again in full after a pause, as a read that
                # raised on its own is.
                return [_failed_read(tier, error) for tier in tiers]

            self._workers[mountpoint].submit(
                batch, progress, name=f"read {len(reads)} tiers", fallback=failed
            )
        self._reads = {}

    def _read_done(self, result: Read) -> None:
        tier = result.tier
        tier.pending = False
        self._unstick(tier.worker)
        source = self._sources.get(tier.job)
        if source is None or tier not in source.tiers:
            return  # removed while read
        now, wall = self.monotonic(), self.clock()
        name = source.name
        if not tier.first_done:
            tier.first_done, tier.first_entries = (
                True,
                tier.reader.entries_read if tier.reader else 0,
            )
            self._health = None
        if result.error is not None:
            # One tree must not stop any other job's reads: this one is read again in full
            # after a pause that grows while it keeps failing.
            if not tier.failures:
                log.error("scan of job=%s tier=%s failed; reading it again in full: %r",
                          name, tier.tier, result.error)  # fmt: skip
            tier.failures += 1
            tier.reconcile_wanted += 1
            tier.retry_at = now + min(60.0, 0.5 * 2**tier.failures)
            self._changed_jobs.add(name)
            self._timers.at(tier.key, tier.retry_at)
            return
        tier.failures = 0
        tier.reconcile_done = max(tier.reconcile_done, result.reconcile)
        tier.last_read, tier.confirmed = now, wall
        if (tier.missing, tier.unreadable) != (result.missing, len(result.unreadable)):
            if result.missing != tier.missing:
                log.warning("job=%s tier=%s: %s %s", name, tier.tier, tier.path,
                            "does not exist: watched from when it appears" if result.missing
                            else "exists now")  # fmt: skip
            tier.missing, tier.unreadable = result.missing, len(result.unreadable)
            self._publish_paths(source)
        self._scan_errors += result.errors
        self._scans.observe(result.seconds)
        self._apply(name, TierRead(tier.tier, result.found, wall, result.unreadable, result.layout))
        self._changed_jobs.add(name)
        self._schedule_read(source, tier, now)
        self._health_changed()

    def _schedule_read(self, source: Source, tier: Tier, now: float) -> None:
        """The tier's next read: now if asked for meanwhile, else its poll or hot re-read."""
        if tier.again or tier.reconcile_wanted > tier.reconcile_done:
            self._timers.at(tier.key, now)
            return
        due = []
        if tier.mode == POLL:
            due.append(_on_grid(tier.last_read + source.policy.poll_interval))
        effects = self._effects.get(source.name)
        if effects is not None and effects.saves_in_progress:
            hot = OBJECT_HOT_RESCAN_SECONDS if is_object_url(tier.path) else HOT_RESCAN_SECONDS
            due.append(tier.last_read + hot)
        if due:
            self._timers.at(tier.key, min(due))
        else:
            self._timers.cancel(tier.key)


def _progress(reader: TreeReader | ObjectTreeReader) -> int:
    """What a reader has done so far: entries listed, and an object store's requests (a read of
    a hundred ListParts lists no entry, and is not stuck)."""
    if isinstance(reader, ObjectTreeReader):
        return reader.entries_read + reader.requests_made
    return reader.entries_read


def _read_tier(
    tier: Tier,
    hot: list[str],
    force: bool,
    reconcile: int,
    touched: Collection[str],
    fixed_layout: str | None,
    options: Options,
) -> Read:
    """One read of the tier, on its worker. A generation this read shows committed (its marker
    new or renewed) had its files last statted mid-write: they are statted again in full within
    the same task, so the core never sees a commit with the sizes of a save in progress."""
    started = time.perf_counter()
    reader = tier.reader
    assert reader is not None
    try:
        before = tier.parsed[1] if tier.parsed is not None else None
        tree, stats = reader.read(hot, force=force, touched=touched)
        errors = stats.errors
        found, layout = _found(tier, tree, fixed_layout, options)
        # Once each: a commit time that is the newest file's mtime rises when it is statted.
        restatted: set[str] = set()
        for round_ in range(RESTAT_ROUNDS + 1):
            committed = [g for g in just_committed(before, found) if g not in restatted]
            if not committed or tree is None:
                break
            if round_ == RESTAT_ROUNDS:
                # More committed while the last ones were statted: the next read compares with
                # the listing before them and states them then (nothing else would: a file
                # that grew in place moved no directory's mtime).
                tier.parsed = (None, before, layout)
                break
            restatted.update(committed)
            before = found
            tree, stats = reader.read(hot, force_paths=[listing_path(g) for g in committed])
            seen = {path for path, _ in errors}
            errors = [*errors, *(error for error in stats.errors if error[0] not in seen)]
            found, layout = _found(tier, tree, fixed_layout, options)
    except Exception as error:
        return _failed_read(tier, error, time.perf_counter() - started)
    unreadable = frozenset(path for path, _ in errors) if errors else _NONE
    return Read(tier, found, unreadable, len(errors), layout,
                 time.perf_counter() - started, reconcile,
                 missing=tree is None and not errors)  # fmt: skip


def just_committed(
    before: Sequence[layouts.Found] | None, after: Sequence[layouts.Found]
) -> list[str]:
    """The generations ``after`` shows committed that ``before`` (the tier's previous listing)
    did not show committed: still being written, not a generation yet (files in a directory
    listed before its marker came), or committed with an older marker (saved again under its
    name). None before: the first listing, which statted everything just now."""
    if before is None:
        return []
    earlier = {item.id: item for item in before}
    committed = []
    for item in after:
        if item.state != COMMITTED:
            continue
        was = earlier.get(item.id)
        if was is None or was.state != COMMITTED:
            committed.append(item.id)
        elif (item.commit_time or 0.0) > (was.commit_time or 0.0):
            committed.append(item.id)  # renewed
    return committed


def _failed_read(tier: Tier, error: Exception, seconds: float = 0.0) -> Read:
    return Read(tier, [], frozenset(), 0, None, seconds, 0, error)


def _found(
    tier: Tier, tree: object, fixed_layout: str | None, options: Options
) -> tuple[list[layouts.Found], str | None]:
    """What the layout finds in the listing, parsed once per listing; and the layout detected."""
    if tree is None:
        return [], None
    if tier.parsed is not None and tier.parsed[0] is tree:
        return tier.parsed[1], tier.parsed[2]
    if fixed_layout:
        name: str | None = fixed_layout
        found = layouts.REGISTRY[fixed_layout].parse(tree, options)  # type: ignore[arg-type]
    else:
        name, found = layouts.identify(tree, options)  # type: ignore[arg-type]
    detected = None if fixed_layout else name
    tier.parsed = (tree, found, detected)
    return found, detected


def _on_grid(due: float) -> float:
    """The next POLL_GRID tick at or after ``due``."""
    return math.ceil(due / POLL_GRID) * POLL_GRID


def _below(root: str, paths: Collection[str]) -> list[str]:
    """The paths inside ``root``, relative to it (the root itself left out)."""
    prefix = root.rstrip("/") + "/"
    return [path[len(prefix) :] for path in paths if path.startswith(prefix)]
