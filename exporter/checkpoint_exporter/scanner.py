"""The scanner thread: rescans jobs when they change, updates the tracker, publishes snapshots.

A job is rescanned when its watcher saw a change, when its poll period is up (network
filesystems), at most once a second while a save is in progress (to see progress and aborts),
and by a full reconcile every ``scan.reconcile_interval`` or after an inotify queue overflow.
Validation of newly committed generations runs on a worker thread so that a slow read never
holds up detection.
"""

from __future__ import annotations

import errno
import logging
import os
import queue
import re
import stat
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace

from checkpoint_exporter import dcp_metadata, fsread, layouts
from checkpoint_exporter.config import Config, DiscoverConfig, Policy
from checkpoint_exporter.layouts.base import Check, Options
from checkpoint_exporter.listing import Dir, OpsBudget, TreeReader
from checkpoint_exporter.model import DURABLE, DaemonState, WatchedPath
from checkpoint_exporter.spool import Event, SpoolReader
from checkpoint_exporter.telemetry.node import NodeTelemetry
from checkpoint_exporter.tracker import Histogram, JobTracker, Tracker, ValidationRequest, job_paths
from checkpoint_exporter.validate import Limits, Verdict, validate
from checkpoint_exporter.watch import (
    INOTIFY,
    POLL,
    Watcher,
    choose_mode,
    is_network,
    mount_of,
    read_mounts,
)

log = logging.getLogger(__name__)

COALESCE_SECONDS = 0.1
# A generation whose checks could not run (I/O trouble, the metadata parser unavailable) is
# checked again after this long, not on every pass.
RETRY_UNCHECKED_SECONDS = 30.0
# Files the watcher named per job between two passes, re-statted on the next one. Past this many,
# the rest are left to the hot re-stat of saves in progress and to the markers' re-stat.
TOUCHED_PER_JOB = 4096

SCAN_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 120)
_JOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


@dataclass
class _Tier:
    tier: str
    path: str
    reader: TreeReader
    mode: str
    reason: str
    mountpoint: str = ""
    disk: str | None = None  # the block device whose writes count for this path
    # The last listing and what the layout found in it: an unchanged listing is the same
    # object, so an idle poll neither parses it again nor rebuilds the job's state.
    parsed: tuple[Dir, list[layouts.Found]] | None = None


@dataclass
class _Source:
    """Scanning state of one job."""

    name: str
    policy: Policy
    tiers: list[_Tier]
    fixed_layout: str | None
    last_scan: float = 0.0
    next_poll: float = 0.0
    reconcile: bool = True
    discovered_from: str | None = None
    missing_since: float | None = None
    failures: int = 0  # scans in a row that raised
    retry_at: float = 0.0  # after a failed scan, not again before this (monotonic)

    @property
    def polled(self) -> bool:
        return any(tier.mode == POLL for tier in self.tiers)


@dataclass
class _Discovery:
    entry: DiscoverConfig
    next_listing: float = 0.0
    excess: int = 0
    reported: set[str] = field(default_factory=set)


def _identity(path: str) -> tuple[int, int] | None:
    try:
        status = os.lstat(path)
    except OSError:
        return None
    return status.st_dev, status.st_ino


class Validator:
    """Runs structural checks on a worker thread; verdicts are collected by the scanner."""

    def __init__(self, limits: Limits):
        self.limits = limits
        self._requests: queue.Queue[tuple[ValidationRequest, str, bool] | None] = queue.Queue()
        # A None verdict: the generation moved or vanished while read; judge it again later.
        self.verdicts: queue.Queue[tuple[ValidationRequest, Verdict | None]] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="validator", daemon=True)
        self._stopping = threading.Event()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop now: requests still queued are dropped, a parse under way is cut short."""
        self._stopping.set()
        self._requests.put(None)
        if self.limits.metadata_parser is not None:
            self.limits.metadata_parser.close()
        self._thread.join(timeout=5)

    def submit(self, request: ValidationRequest, root: str, follow_root: bool = True) -> None:
        """``follow_root``: whether ``root`` itself may be a symlink (a configured root)."""
        self._requests.put((request, root, follow_root))

    def _run(self) -> None:
        while (item := self._requests.get()) is not None and not self._stopping.is_set():
            request, root, follow_root = item
            target = os.path.join(root, request.generation)
            before = _identity(target)
            try:
                verdict = _validate_beneath(root, follow_root, request.found.checks, self.limits)
            except Exception as error:  # our bug, not the checkpoint's: no verdict, asked later
                log.exception("validation of %s/%s failed", root, request.generation)
                verdict = Verdict(False, None, f"not checked: {error!r}", unchecked=True)
            if verdict is None:  # gone, or swapped for a symlink since it was listed
                self.verdicts.put((request, None))
                continue
            if verdict.unchecked:
                log.warning(
                    "checkpoint not checked: job=%s generation=%s %s; trying again in %g s",
                    request.job, request.generation, verdict.detail, RETRY_UNCHECKED_SECONDS,
                )  # fmt: skip
                self.verdicts.put((request, verdict))
                continue
            if not verdict.valid and (before is None or _identity(target) != before):
                # Renamed, replaced or deleted under the reader (retention, a writer's rename):
                # what was missing is not the checkpoint's fault.
                log.debug("job=%s generation=%s moved while read", request.job, request.generation)
                self.verdicts.put((request, None))
                continue
            if not verdict.valid:
                log.warning(
                    "invalid checkpoint: job=%s generation=%s reason=%s %s",
                    request.job, request.generation, verdict.reason, verdict.detail,
                )  # fmt: skip
            elif verdict.detail:
                log.warning(
                    "checkpoint partly checked: job=%s generation=%s %s",
                    request.job, request.generation, verdict.detail,
                )  # fmt: skip
            self.verdicts.put((request, verdict))


def _validate_beneath(
    root: str, follow_root: bool, checks: Sequence[Check], limits: Limits
) -> Verdict | None:
    """``validate``, with every check read through a descriptor of the directory holding it,
    reached from the tier root one component at a time without following symlinks: a directory
    swapped for a symlink since the listing leads nowhere (None: no verdict, asked again)."""
    step, details = None, []
    for check in checks:
        try:
            opened = _open_beneath(root, check.path, follow_root)
        except FileNotFoundError:
            return None
        if opened is None:
            return None
        directory, reached = opened
        try:
            base = f"/proc/self/fd/{directory}"
            verdict = validate(base, [replace(check, path=_strip(check.path, reached))], limits)
        finally:
            os.close(directory)
        if not verdict.valid:
            return verdict
        step = verdict.step if step is None else step
        if verdict.detail:
            details.append(verdict.detail)
    return Verdict(True, detail="; ".join(details), step=step)


def _open_beneath(root: str, relative: str, follow_root: bool) -> tuple[int, str] | None:
    """A descriptor of the deepest directory on the way to ``relative`` (itself when it is a
    directory, else the one holding it), opened one component at a time without following
    symlinks, and its path below ``root``; None when a symlink stands where a directory was."""
    directory = fsread.open_directory(root, follow_symlink=follow_root)
    reached: list[str] = []
    try:
        for part in [p for p in relative.split("/") if p not in ("", ".")]:
            try:
                child = fsread.open_directory(part, dir_fd=directory)
            except OSError as error:
                if error.errno not in (errno.ENOTDIR, errno.ELOOP):
                    raise
                if stat.S_ISREG(os.lstat(part, dir_fd=directory).st_mode):
                    break  # a file: the checks read it through its directory's descriptor
                os.close(directory)
                return None
            os.close(directory)
            directory = child
            reached.append(part)
    except BaseException:
        os.close(directory)
        raise
    return directory, "/".join(reached)


def _strip(path: str, prefix: str) -> str:
    if not prefix:
        return path
    return "." if path == prefix else path.removeprefix(prefix + "/")


class Scanner:
    def __init__(
        self,
        config: Config,
        tracker: Tracker,
        watcher_factory: Callable[..., Watcher] | None = Watcher,
        clock: Callable[[], float] = time.time,
        telemetry: NodeTelemetry | None = None,
    ) -> None:
        self.config = config
        self.telemetry = telemetry
        self.tracker = tracker
        self.clock = clock
        self._mounts = read_mounts(config.paths.procfs)
        self._network_budget = OpsBudget(config.scan.metadata_ops_per_second)
        self._local_budget = OpsBudget(0)
        self._scans = Histogram(SCAN_BUCKETS)
        self._scan_errors = 0
        self._overflows = 0
        self._dirty: set[str] = set()
        self._touched: dict[str, set[str]] = {}  # job -> absolute paths events named
        self._reconcile_all_at = time.monotonic() + config.scan.reconcile_interval
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scanner", daemon=True)
        self.validator = Validator(
            Limits(
                checksum_bytes_per_second=config.scan.checksum_bytes_per_second,
                metadata_parser=dcp_metadata.IsolatedParser(config.scan.metadata_memory_bytes),
            )
        )
        self.watcher = None
        if watcher_factory is not None:
            self.watcher = watcher_factory(self._changed, self._overflowed, self._lost)
        self._lost_watches: dict[str, str] = {}  # job -> why its inotify watch was given up
        # Only the directories of the jobs watched here are read; the others are counted.
        self.spool = SpoolReader(
            config.spool, config.spool_retention, known_jobs=lambda: self.tracker.jobs
        )
        self._sources: dict[str, _Source] = {}
        self._discoveries = [_Discovery(entry) for entry in config.discover]
        for job in config.jobs:
            self._add(job.name, job_paths(job), job.policy, None)

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        if self.watcher is not None:
            self.watcher.start()
        self.validator.start()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=5)
        self.validator.stop()
        if self.watcher is not None:
            self.watcher.stop()

    def _run(self) -> None:
        failing = False
        while not self._stop.is_set():
            try:
                self.step()
                failing = False
            except Exception:
                # Once per run of failures: a persistent fault must not flood the log.
                if not failing:
                    log.exception("scan pass failed; retrying every 0.2 s")
                failing = True
            if self._wake.wait(timeout=0.2):
                # Coalesce: a save's shards arrive as a stream of events, and each pass lstats
                # every generation directory of the job. One pass per COALESCE_SECONDS keeps a
                # save's cost to its new files (and adds at most that much to detection).
                self._stop.wait(COALESCE_SECONDS)
            self._wake.clear()

    # --- watcher callbacks (other threads) ---------------------------------------------------

    def _changed(self, key: str, path: str) -> None:
        with self._lock:
            self._dirty.add(key)
            touched = self._touched.setdefault(key, set())
            if len(touched) < TOUCHED_PER_JOB:
                touched.add(path)
        self._wake.set()

    def _overflowed(self, path: str | None) -> None:
        with self._lock:
            self._overflows += 1
            for source in self._sources.values():
                if path is None or any(
                    _contains(tier.path, path) or _contains(path, tier.path)
                    for tier in source.tiers
                ):
                    source.reconcile = True
        log.warning("inotify queue overflowed below %s: reconciling", path or "a watch")
        self._wake.set()

    def _lost(self, key: str, reason: str) -> None:
        with self._lock:
            self._lost_watches[key] = reason
        self._wake.set()

    def _fall_back_to_polling(self) -> None:
        """Jobs whose tree grew past the inotify limits are polled from now on (scanner thread)."""
        with self._lock:
            lost, self._lost_watches = self._lost_watches, {}
        for name, reason in lost.items():
            source = self._sources.get(name)
            if source is None or self.watcher is None:
                continue
            self.watcher.unwatch(name)
            for tier in source.tiers:
                if tier.mode == INOTIFY:
                    tier.mode, tier.reason = POLL, reason
            log.warning("job=%s: %s; polling instead", name, reason)
            source.reconcile = True  # what changed unwatched is found by a full read
            self._publish_paths(name, source.tiers)

    # --- jobs --------------------------------------------------------------------------------

    def _add(
        self,
        name: str,
        paths: tuple[WatchedPath, ...],
        policy: Policy,
        discovered_from: str | None,
    ) -> None:
        tiers = []
        for watched in paths:
            mount = mount_of(watched.path, self._mounts)
            mode, reason = choose_mode(policy.watch, mount)
            # Shared storage gets the budget whether it is polled or (configured so) watched.
            network = mount is not None and is_network(mount.fstype)
            budget = self._network_budget if network else self._local_budget
            reader = TreeReader(
                watched.path,
                budget,
                layouts.ALL_CONTENT_FILES,
                self.config.scan.max_depth,
                marker_names=layouts.MARKER_NAMES,
                marker_suffixes=layouts.MARKER_SUFFIXES,
                # A discovered job's directory belongs to a tenant: never followed if it is
                # (or becomes) a symlink. A configured root may be one, as the operator chose.
                follow_root_symlink=None if discovered_from is None else False,
            )
            if mode == INOTIFY and self.watcher is not None:
                failure = self.watcher.watch(
                    name, watched.path, max_depth=self.config.scan.max_depth
                )
                if failure is not None:
                    mode, reason = POLL, failure
                    log.warning("job=%s path=%s: %s; polling instead", name, watched.path, failure)
            tier = _Tier(watched.tier, watched.path, reader, mode, reason)
            if mount is not None:
                tier.mountpoint = mount.mountpoint
            if self.telemetry is not None:
                placement = self.telemetry.place(watched.path, mount)
                tier.disk = placement.block_device.name if placement.block_device else None
            tiers.append(tier)
            log.info("watching job=%s tier=%s path=%s mode=%s (%s)",
                     name, watched.tier, watched.path, mode, reason)  # fmt: skip
        fixed = None if policy.layout == "auto" else policy.layout
        source = _Source(name, policy, tiers, fixed, discovered_from=discovered_from)
        self._sources[name] = source
        if name not in self.tracker.jobs:
            self.tracker.add(JobTracker(name, paths, policy))
        # One counter for what the reader refused and what the job's clocks gave up.
        self.tracker.jobs[name].clocks.dropped = self.spool.dropped_total
        self._publish_paths(name, tiers)

    def _publish_paths(self, name: str, tiers: list[_Tier]) -> None:
        job = self.tracker.jobs[name]
        job.paths = tuple(
            WatchedPath(tier.tier, tier.path, tier.mode, tier.mountpoint) for tier in tiers
        )
        job.changed()

    def _remove(self, name: str) -> None:
        self._sources.pop(name, None)
        self.tracker.forget(name)
        if self.watcher is not None:
            self.watcher.unwatch(name)

    def _discover(self, now: float) -> None:
        configured = {job.name for job in self.config.jobs}
        for discovery in self._discoveries:
            entry = discovery.entry
            if now < discovery.next_listing:
                continue
            discovery.next_listing = now + entry.policy.poll_interval
            try:
                with os.scandir(entry.root) as listing:
                    names = sorted(e.name for e in listing if e.is_dir(follow_symlinks=False))
            except OSError as error:
                log.warning("cannot list discover root %s: %s", entry.root, error.strerror)
                continue
            present = {n for n in names if _JOB_NAME.fullmatch(n) and n not in configured}
            root = str(entry.root)
            wall = self.clock()
            tracked = [n for n, src in self._sources.items() if src.discovered_from == root]
            for name in tracked:
                source = self._sources[name]
                if name in present:
                    source.missing_since = None
                    continue
                # Gone: kept (its last state visible) until forget_after, then dropped.
                source.missing_since = source.missing_since or wall
                if wall - source.missing_since >= entry.forget_after:
                    log.info("forgetting job=%s: gone from %s", name, root)
                    self._remove(name)
            tracked = [n for n in tracked if n in self._sources]
            candidates = sorted(present - set(tracked))
            slots = max(0, entry.max_jobs - len(tracked))
            for name in candidates[:slots]:
                self._add(
                    name, (WatchedPath(DURABLE, os.path.join(root, name)),), entry.policy, root
                )
            discovery.excess = len(candidates) - min(slots, len(candidates))
            for name in candidates[slots:]:
                if name not in discovery.reported:
                    discovery.reported.add(name)
                    log.warning(
                        "discover root %s: job %s is over max_jobs=%d and is not watched",
                        root, name, entry.max_jobs,
                    )  # fmt: skip

    # --- scanning ----------------------------------------------------------------------------

    def step(self) -> None:
        """One pass: discover, rescan what is due, apply verdicts, abort stalled saves, publish."""
        now = time.monotonic()
        self._discover(now)
        if now >= self._reconcile_all_at:
            self._reconcile_all_at = now + self.config.scan.reconcile_interval
            for source in self._sources.values():
                source.reconcile = True
        self._fall_back_to_polling()
        with self._lock:
            dirty, self._dirty = self._dirty, set()
            touched, self._touched = self._touched, {}
        self._read_spool()  # before the disk: a save's start is filed before its commit is seen
        for name, source in list(self._sources.items()):
            if not self._due(source, name in dirty, now):
                continue
            try:
                self._scan(source, now, touched.get(name, ()))
                source.failures = 0
            except Exception:
                # One job's tree must not stop every other job's scan: the others go on, and
                # this one is read again in full after a pause that grows while it keeps failing.
                if not source.failures:
                    log.exception("scan of job=%s failed; reading it again in full", name)
                source.failures += 1
                source.reconcile = True
                source.retry_at = now + min(60.0, 0.5 * 2**source.failures)
        self._apply_verdicts()
        wall = self.clock()
        for job in self.tracker.jobs.values():
            job.tick(wall)
        if self.telemetry is None:
            self.tracker.publish(self._daemon_state())
            return
        self._correlate(wall)
        self.tracker.publish(
            self._daemon_state(),
            self.telemetry.filesystems(self._reserves()),
            self.telemetry.available(),
        )

    def _correlate(self, wall: float) -> None:
        """Attach to each job's newest finished save what this node's devices did during it,
        once the samples after its end are in."""
        assert self.telemetry is not None
        settle = 1.5 * self.config.telemetry.sample_interval
        for name, source in self._sources.items():
            job = self.tracker.jobs.get(name)
            if job is None or job.last_window is None:
                continue
            start, end = job.last_window
            done = job.window_telemetry
            if (done is not None and (done.start, done.end) == (start, end)) or wall < end + settle:
                continue
            disks = {tier.disk for tier in source.tiers if tier.disk}
            job.set_window_telemetry(self.telemetry.correlate(start, end, disks))

    def _reserves(self) -> dict[str, float]:
        reserves: dict[str, float] = {}
        for source in self._sources.values():
            for tier in source.tiers:
                if tier.mountpoint:
                    reserve = max(
                        reserves.get(tier.mountpoint, 0.0), source.policy.capacity_reserve
                    )
                    reserves[tier.mountpoint] = reserve
        return reserves

    def _read_spool(self) -> None:
        by_job: dict[str, list[Event]] = {}
        for event in self.spool.poll(self.clock()):
            by_job.setdefault(event.training_job, []).append(event)
        for name, events in by_job.items():
            job = self.tracker.jobs.get(name)
            if job is not None:
                job.apply_events(events, self.clock())

    def _due(self, source: _Source, dirty: bool, now: float) -> bool:
        if now < source.retry_at:
            return False
        if dirty or source.reconcile:
            return True
        if source.polled and now >= source.next_poll:
            return True
        job = self.tracker.jobs.get(source.name)
        if job is None:
            return False
        if job.validation_retry_due(self.clock()):
            return True
        return job.has_saves_in_progress() and now - source.last_scan >= 1.0

    def _scan(self, source: _Source, now: float, touched: Collection[str] = ()) -> None:
        started = time.perf_counter()
        job = self.tracker.jobs[source.name]
        for tier in source.tiers:
            hot = job.hot_directories(tier.tier)
            tree, stats = tier.reader.read(
                hot, force=source.reconcile, touched=_below(tier.path, touched)
            )
            self._scan_errors += len(stats.errors)
            unreadable = {path for path, _ in stats.errors}
            found = self._found(source, tier, tree)
            requests = job.observe(tier.tier, found, self.clock(), unreadable)
            if job.just_committed:
                # Sizes were last statted mid-write: one full read of what just committed.
                committed = ["" if gen_id == "." else gen_id for gen_id in job.just_committed]
                tree, stats = tier.reader.read(hot, force_paths=committed)
                self._scan_errors += len(stats.errors)
                unreadable = {path for path, _ in stats.errors}
                found = self._found(source, tier, tree)
                requests = job.observe(tier.tier, found, self.clock(), unreadable)
            for request in requests:
                job.submitted(request)
                self.validator.submit(request, tier.path, tier.reader.follow_root_symlink)
        source.reconcile = False
        source.last_scan = now
        source.next_poll = now + source.policy.poll_interval
        self._scans.observe(time.perf_counter() - started)

    def _found(self, source: _Source, tier: _Tier, tree: Dir | None) -> list[layouts.Found]:
        if tree is None:
            return []
        if tier.parsed is not None and tier.parsed[0] is tree:
            return tier.parsed[1]
        found = self._parse(source, tier, tree)
        tier.parsed = (tree, found)
        return found

    def _parse(self, source: _Source, tier: _Tier, tree: Dir) -> list[layouts.Found]:
        job = self.tracker.jobs[source.name]
        name = source.fixed_layout or layouts.detect(tree)
        if name is None:
            return []  # nothing recognisable yet
        if tier.tier == DURABLE and name != job.layout and not source.fixed_layout:
            log.info("job=%s: layout detected as %s", source.name, name)
            job.layout = name
            job.changed()
        options = Options(verify_checksums=source.policy.verify_checksums)
        return layouts.REGISTRY[name].parse(tree, options)

    def _apply_verdicts(self) -> None:
        while True:
            try:
                request, verdict = self.validator.verdicts.get_nowait()
            except queue.Empty:
                return
            job = self.tracker.jobs.get(request.job)
            if job is None:
                continue
            if verdict is None:
                job.retry_validation(request)
                with self._lock:
                    self._dirty.add(request.job)  # rescan: the move shows up, or it is judged again
            elif verdict.unchecked:
                job.retry_validation(request, self.clock() + RETRY_UNCHECKED_SECONDS)
            else:
                job.apply_verdict(request, verdict)

    def _daemon_state(self) -> DaemonState:
        return DaemonState(
            scans=self._scans.state(),
            metadata_operations=self._network_budget.total + self._local_budget.total,
            watch_overflows=self._overflows,
            scan_errors=self._scan_errors,
            spool_events=tuple(sorted(self.spool.events_total.items())),
            spool_invalid=tuple(sorted(self.spool.invalid_total.items())),
            spool_dropped=tuple(sorted(self.spool.dropped_total.items())),
            spool_dropped_bytes=tuple(sorted(self.spool.dropped_bytes_total.items())),
            spool_backlog_bytes=self.spool.backlog_bytes,
            spool_poll_seconds=self.spool.poll_seconds_total,
            discover_excess=tuple((str(d.entry.root), d.excess) for d in self._discoveries),
        )


def _below(root: str, paths: Collection[str]) -> list[str]:
    """The paths inside ``root``, relative to it (the root itself left out)."""
    prefix = root.rstrip("/") + "/"
    return [path[len(prefix) :] for path in paths if path.startswith(prefix)]


def _contains(parent: str, child: str) -> bool:
    parent = parent.rstrip("/")
    return child == parent or child.startswith(parent + "/")
