"""The daemon's core: one thread that owns every job's state, fed by per-filesystem workers.

Nothing walks all jobs on a fixed tick. The core thread sleeps until the earliest timer in its
queue (``daemon.timers``) or until something arrives: a watch event, a worker's result, a
verdict. What it then does costs what is due:

- a watch event schedules a read of the job's tier (coalesced for ``COALESCE_SECONDS``: a save's
  shards arrive as a stream of events); a polled tier (network filesystems) is read every
  ``poll_interval``; a job with a save in progress is read once a second (to see progress,
  settling and aborts); a full reconcile comes every ``scan.reconcile_interval`` and after an
  inotify queue overflow;
- a job's own timer (``JobTracker.next_due``: abort deadlines, spool timelines to settle,
  unchecked generations to ask again, the telemetry window to correlate) fires only when set;
- the spool is polled on its own timer, every ``SPOOL_POLL_SECONDS``, as before.

Every read of a watched path runs on the worker of its filesystem (``daemon.workers``), so a
hung mount stalls only its own jobs: a task that makes no progress for ``STUCK_SECONDS`` marks
the mount stuck (``DaemonState.mounts``), its jobs are not read again until the task returns,
and every other job keeps its latency. Workers hand back values (a scan result per tier); only
the core thread touches the trackers. Validation reads run on a validator per filesystem, so
a read hung on one mount holds up no other mount's checks; a hung validation read is not itself
reported (a hang that stops data reads but not metadata, an object server down, leaves the
generation unjudged and its mount unflagged).

A process serves the scopes it is told (``config.serving``: ``--scope``, ``--shard``). A tier of
a scope it does not serve is never placed, read, watched or validated: an explicit ``scope`` is
known at once, ``auto`` is decided when the tier is placed, from its mount (network and parallel
filesystems are shared, local ones node). A node-scope process still lists a discover root on a
shared filesystem, once per poll interval, to learn the names of the jobs whose spool events it
reads; it never reads below it. A shared-scope process keeps only the jobs of its shard, reads no
spool and correlates no telemetry window (its node is no training node).

The port opens before the first pass: ``readiness`` says when every tier has been read once (or
sits on a stuck mount), ``liveness`` fails only when this loop stops turning.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import queue
import re
import stat
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace

from checkpoint_exporter.config import NODE, SHARED, Config, DiscoverConfig, JobConfig, Policy
from checkpoint_exporter.core.tracker import (
    Histogram,
    JobTracker,
    Tracker,
    ValidationRequest,
    job_paths,
)
from checkpoint_exporter.daemon.timers import TimerQueue
from checkpoint_exporter.daemon.validator import RETRY_UNCHECKED_SECONDS, Validator
from checkpoint_exporter.daemon.workers import MountWorker, TaskFailed, WorkerFactory
from checkpoint_exporter.events import Event
from checkpoint_exporter.model import DURABLE, DaemonState, Verdict, WatchedPath
from checkpoint_exporter.sources import dcp_metadata, fsread, layouts
from checkpoint_exporter.sources.layouts.base import Options
from checkpoint_exporter.sources.listing import OpsBudget, TreeReader
from checkpoint_exporter.sources.spool import HOLD, SpoolReader
from checkpoint_exporter.sources.telemetry.node import NodeTelemetry
from checkpoint_exporter.sources.validate import Limits
from checkpoint_exporter.sources.watch import (
    INOTIFY,
    POLL,
    Mount,
    Watcher,
    choose_mode,
    is_network,
    mount_of,
    mount_of_name,
    read_mounts,
)

log = logging.getLogger(__name__)

COALESCE_SECONDS = 0.1
# Files the watcher named per tier between two reads, re-statted on the next one. Past this many,
# the rest are left to the hot re-stat of saves in progress and to the markers' re-stat.
TOUCHED_PER_JOB = 4096
HOT_RESCAN_SECONDS = 1.0  # a job with a save in progress is read this often
# Polls fall due on ticks this far apart, so the jobs polled at one interval are read in one
# batch per tick rather than one thread wake-up each (at most this much later).
POLL_GRID = 0.25
SPOOL_POLL_SECONDS = 0.2  # the spool's cadence (it was read on every 0.2 s pass before)
SPOOL_CHECK_SECONDS = 2.0  # whether training jobs can write the spool, checked this often (a stat)
# A filesystem task (a read, a stat) that completes no metadata operation for this long marks
# its mount stuck. A healthy NFS, Lustre or GPFS operation takes milliseconds and its bad tail a
# few seconds (a lock recall, a server failover is 10-20 s); a soft NFS mount itself gives up only
# after minutes (timeo=60 s, retrans). 30 s of nothing is no slow disk, it is well inside the
# minutes the staleness alerts work in, and a cold pass that crawls under the metadata-ops budget
# still moves (its progress is what is timed, not its length).
STUCK_SECONDS = 30.0
# An inotify-watched tier is not read while nothing changes: a stat of one of its filesystem's
# roots, this often, confirms the view is current (the filesystem answers, so events would come).
PROBE_SECONDS = 30.0
# The loop turns at least this often even with nothing due, so liveness can tell idle from wedged.
HEARTBEAT_SECONDS = 5.0
# liveness fails when the loop has not turned for this long. A turn is in-memory work plus one
# spool poll (bounded at a few thousand lines): it takes milliseconds, and the loop never waits on
# a filesystem, so a minute without a turn is a wedged core, not a slow disk.
LIVENESS_SECONDS = 60.0
NODE_REFRESH_SECONDS = 1.0  # node telemetry (filesystems, what has data) republished this often
# Each tier's view age is republished at most this often (alerts on stale data work in minutes;
# the first pass's progress, once a second).
HEALTH_REFRESH_SECONDS = 5.0
PROGRESS_REFRESH_SECONDS = 1.0

SCAN_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 120)
_JOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


@dataclass(eq=False)
class _Tier:
    """One watched path of a job: how it is watched, and where its reads stand."""

    job: str
    tier: str
    path: str
    follow_root: bool | None  # may the root be a symlink (None: a configured root decides)
    worker: str  # the mount whose worker reads it ("" while unknown)
    scope: str = ""  # node or shared; "" while ``auto`` waits for the tier to be placed
    mode: str = ""
    reason: str = ""
    mountpoint: str = ""
    disk: str | None = None  # the block device whose writes count for this path
    reader: TreeReader | None = None  # made on its worker: the root may hang
    # The last listing and what the layout found in it (worker side): an unchanged listing is
    # the same object, so an idle poll neither parses it again nor rebuilds the job's state.
    parsed: tuple[object, list[layouts.Found], str | None] | None = None
    # Full reads asked for and done, counted: a read satisfies only the requests made before
    # it started, so an overflow during a read still gets its own.
    reconcile_wanted: int = 1
    reconcile_done: int = 0
    touched: set[str] = field(default_factory=set)
    pending: bool = False  # a read is on its worker
    again: bool = False  # asked for while one was under way, or while its mount was stuck
    first_done: bool = False
    first_entries: int = 0
    last_read: float = 0.0  # monotonic
    confirmed: float = 0.0  # wall time the view was last known current
    failures: int = 0  # reads in a row that raised
    retry_at: float = 0.0  # after a failed read, not again before this (monotonic)
    missing: bool = False  # its last read found no directory there
    unreadable: int = 0  # directories its last read could not read

    @property
    def key(self) -> tuple[str, str, str]:
        return ("scan", self.job, self.tier)


@dataclass(eq=False)
class _Source:
    """Scanning state of one job."""

    name: str
    policy: Policy
    tiers: list[_Tier]
    fixed_layout: str | None
    discovered_from: str | None = None
    missing_since: float | None = None
    config: JobConfig | None = None  # what the config file said (None: discovered)


@dataclass
class _Discovery:
    entry: DiscoverConfig
    listing: bool = False  # a listing is on its worker
    listed: bool = False  # listed once: its jobs count towards readiness
    excess: int = 0
    reported: set[str] = field(default_factory=set)
    missing: bool = False  # the root does not exist (yet)
    # Jobs that gave their slot to a newer one, by their directory's mtime then: watched again
    # only once written since, so two idle jobs never take turns.
    displaced: dict[str, float] = field(default_factory=dict)


# --- values the workers hand back -------------------------------------------------------------


@dataclass(frozen=True)
class _Placed:
    tier: _Tier
    mount: Mount | None
    mode: str
    reason: str
    reader: TreeReader | None  # None: outside this process's scopes, never read
    scope: str


@dataclass(frozen=True)
class _Read:
    tier: _Tier
    found: list[layouts.Found]
    unreadable: frozenset[str]
    errors: int
    layout: str | None  # detected, when not fixed by the config
    seconds: float
    reconcile: int  # the full-read request it satisfies (0: not a full read)
    final: bool  # the one more read of what just committed
    error: Exception | None = None
    missing: bool = False  # no directory at the tier's path


@dataclass(frozen=True)
class _Candidate:
    """A subdirectory of a discover root."""

    name: str
    mtime: float  # the directory's own: it moves when a generation is added or removed
    empty: bool  # nothing in it: no job yet (a mkdir costs nothing; it takes no max_jobs slot)


@dataclass(frozen=True)
class _Listed:
    discovery: _Discovery
    found: list[_Candidate] | None  # None: could not be listed
    missing: bool = False  # the root does not exist


@dataclass(frozen=True)
class _Probed:
    worker: str
    at: float  # wall time the filesystem answered


class Scanner:
    def __init__(
        self,
        config: Config,
        tracker: Tracker,
        watcher_factory: Callable[..., Watcher] | None = Watcher,
        clock: Callable[[], float] = time.time,
        telemetry: NodeTelemetry | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        worker_factory: WorkerFactory = MountWorker,
    ) -> None:
        """``clock`` (wall) and ``monotonic`` are the core's clocks (its timers run on
        ``monotonic``); ``worker_factory`` makes a mount's worker (``InlineWorker`` runs each
        task as it is submitted: a test drives the loop with ``turn()``, no thread)."""
        self.config = config
        self.serving = config.serving
        self.telemetry = telemetry
        # Save windows are this node's: a shared-scope process runs on no training node.
        self._correlating = telemetry is not None and NODE in self.serving.scopes
        self.tracker = tracker
        self.clock = clock
        self.monotonic = monotonic
        self._worker_factory = worker_factory
        self._mounts = read_mounts(config.paths.procfs)
        self._network_budget = OpsBudget(config.scan.metadata_ops_per_second)
        self._local_budget = OpsBudget(0)
        self._scans = Histogram(SCAN_BUCKETS)
        self._scan_errors = 0
        self._overflows = 0
        self._task_failures: dict[str, int] = {}  # by mountpoint: worker tasks that raised
        self._timers: TimerQueue[tuple[str, ...]] = TimerQueue()
        # Everything other threads hand the core: watch events, worker results, reloads.
        self._inbox: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._verdicts: queue.Queue[tuple[ValidationRequest, Verdict | None]] = queue.Queue()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="scanner", daemon=True)
        self._started = False
        # Set by the thread itself: a probe served while Thread.start() runs (the port opens
        # before the scanner starts) finds it not alive yet, which is not "exited".
        self._running = False
        self._turned_at = time.monotonic()
        self._parser = dcp_metadata.IsolatedParser(config.scan.metadata_memory_bytes)
        self._limits = Limits(
            checksum_bytes_per_second=config.scan.checksum_bytes_per_second,
            metadata_parser=self._parser,
        )
        self._workers: dict[str, MountWorker] = {}
        self._validators: dict[str, Validator] = {}
        self.watcher = None
        if watcher_factory is not None:
            self.watcher = watcher_factory(self._changed, self._overflowed, self._lost)
        # Only the directories of the jobs watched here are read, and only their owners'.
        self.spool = SpoolReader(
            config.spool, config.spool_retention, known_jobs=self._spool_owners
        )
        self._sources: dict[str, _Source] = {}
        self._discoveries = [_Discovery(entry) for entry in config.discover]
        self._changed_jobs: set[str] = set()  # to publish
        self._reads: dict[str, list[tuple[Callable[[], _Read], _Tier]]] = {}  # to send
        self._held: set[str] = set()  # jobs whose just-committed files are being read again
        self._republish = True
        self._health: tuple[object, ...] | None = None  # ready, first_scans, mounts, scan_success
        self._ready = False
        self._not_ready = "first pass not started"
        self._reserves: dict[str, float] | None = None
        self._node: tuple[tuple, tuple] = ((), ())  # filesystems, telemetry sources with data
        self._reload: tuple[bool, float] = (True, self.clock())  # successful, success time
        self._spool_writable: bool | None = None  # checked where the spool is read
        # What a reload that changed a discover root knew of its jobs' lives, until each is found
        # again under it (a new tracker, the same job).
        self._lives: dict[str, JobTracker] = {}
        self._spool_checked = -math.inf
        self._armed = False  # the first turn sets the timers that always run
        for job in config.jobs:
            if self.serving.tracks(job.name):
                self._add(job.name, job_paths(job), job.policy, None, job)

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        if self.watcher is not None:
            self.watcher.start()
        for worker in self._workers.values():
            worker.start()
        for validator in self._validators.values():
            validator.start()
        # Before the thread: its first turn may add a mount's worker, started only if this is set.
        self._started = True
        self._turned_at = time.monotonic()
        self._thread.start()

    def stop(self, timeout: float = 1.0) -> None:
        """Stop within about ``timeout``: nothing waits on a thread stuck in the kernel."""
        self._stop.set()
        self._wake.set()
        deadline = time.monotonic() + timeout
        self._thread.join(timeout=timeout)
        # Copies: a turn still running past the join may add a mount's worker.
        for worker in list(self._workers.values()):
            worker.stop()
        for validator in list(self._validators.values()):
            validator.stop(timeout=max(0.0, deadline - time.monotonic()))
        if self.watcher is not None:
            self.watcher.stop()

    def liveness(self) -> str | None:
        """None while the core loop turns; else why not (a wedged core, never a hung mount)."""
        if not self._running:
            return None
        if not self._thread.is_alive() and not self._stop.is_set():
            return "the scanner thread has exited"
        quiet = time.monotonic() - self._turned_at
        if quiet > LIVENESS_SECONDS:
            return f"the scanner loop has not turned for {quiet:.0f} s"
        return None

    def readiness(self) -> str | None:
        """None once every tier was read once (or sits on a stuck mount); else how far along."""
        return None if self._ready else self._not_ready  # set by the core: no shared iteration

    def reload(self, config: Config) -> None:
        """Take a newly loaded configuration (any thread): jobs added, removed or changed take
        effect, unchanged jobs keep their state."""
        self._post(("reload", config))

    def reload_failed(self) -> None:
        """The configuration file could not be loaded again: the running one stays."""
        self._post(("reload failed",))

    def _post(self, item: object) -> None:
        self._inbox.put(item)
        self._wake.set()

    def _main(self) -> None:
        self._running = True
        self._run()

    def turn(self) -> None:
        """One turn of the core loop, without waiting: what arrived, then what is due. The
        thread calls it in a loop; a test calls it with an ``InlineWorker`` and a fake clock."""
        if not self._armed:
            self._arm()
        self._wake.clear()
        self._turn()

    def _arm(self) -> None:
        """The timers that run from the first turn on."""
        self._armed = True
        now = self.monotonic()
        if NODE in self.serving.scopes:  # the spool is the node's
            self._timers.at(("spool",), now)
        self._timers.at(("reconcile",), now + self.config.scan.reconcile_interval)
        self._timers.at(("node",), now)
        for index in range(len(self._discoveries)):
            self._timers.at(("discover", str(index)), now)

    def _run(self) -> None:
        failing = False
        while not self._stop.is_set():
            try:
                self.turn()
                failing = False
            except Exception:
                # Once per run of failures: a persistent fault must not flood the log.
                if not failing:
                    log.exception("scanner turn failed; going on")
                failing = True
            self._turned_at = time.monotonic()
            due = self._timers.next_due()
            wait = HEARTBEAT_SECONDS if due is None else due - self.monotonic()
            self._wake.wait(timeout=min(HEARTBEAT_SECONDS, max(0.0, wait)))

    def _turn(self) -> None:
        items = []
        while True:
            try:
                items.append(self._inbox.get_nowait())
            except queue.Empty:
                break
        if NODE in self.serving.scopes and any(isinstance(i, (_Read, list)) for i in items):
            # The spool before the disk: a save's events are filed before its commit is applied,
            # or an instrumented save whose commit is read first is counted twice (once from the
            # disk alone, once from its events).
            self._read_spool()
        # One item's or timer's failure (a bug) must not drop the others of this turn: a lost
        # read leaves its tier pending for good, a lost timer is never due again.
        failed: Exception | None = None
        for item in items:
            try:
                self._receive(item)
            except Exception as error:
                failed = failed or error
        self._apply_verdicts()
        now = self.monotonic()
        for key in self._timers.pop_due(now):
            try:
                self._due(key, now)
            except Exception as error:
                failed = failed or error
            if self._stop.is_set():
                return
        self._send_reads()
        self._publish()
        if failed is not None:
            raise failed  # logged by the loop, once per run of failures

    def _receive(self, item: object) -> None:
        if isinstance(item, list):  # a batch of reads
            for read in item:
                self._read_done(read)
        elif isinstance(item, _Read):
            self._read_done(item)
        elif isinstance(item, _Placed):
            self._placed(item)
        elif isinstance(item, _Listed):
            self._listed(item)
        elif isinstance(item, _Probed):
            self._probed(item)
        elif isinstance(item, TaskFailed):
            self._task_failed(item)
        elif isinstance(item, tuple):
            kind, *args = item
            if kind == "changed":
                self._on_changed(*args)
            elif kind == "overflowed":
                self._on_overflowed(*args)
            elif kind == "lost":
                self._on_lost(*args)
            elif kind == "reload":
                self._apply_config(*args)
            elif kind == "reload failed":
                self._reload = (False, self._reload[1])
                self._republish = True

    def _task_failed(self, failed: TaskFailed) -> None:
        """A worker task raised (a bug): logged here, once, counted, and what the core set up
        for it undone through its fallback (a read batch's tiers read again, a listing retried)."""
        mountpoint = failed.mountpoint
        self._task_failures[mountpoint] = self._task_failures.get(mountpoint, 0) + 1
        self._republish = True
        log.error("task %r on the worker of %s failed", failed.task,
                  mountpoint or "(unknown mount)", exc_info=failed.error)  # fmt: skip
        self._unstick(mountpoint)  # its worker answered
        if failed.fallback is not None:
            self._receive(failed.fallback)

    def _due(self, key: tuple[str, ...], now: float) -> None:
        kind = key[0]
        if kind == "scan":
            self._scan_due(key[1], key[2], now)
        elif kind == "job":
            self._job_due(key[1], now)
        elif kind == "spool":
            self._read_spool()
            self._timers.at(key, now + SPOOL_POLL_SECONDS)
        elif kind == "stuck":
            self._check_stuck(key[1], now)
        elif kind == "probe":
            self._probe(key[1], now)
        elif kind == "discover":
            self._discover(int(key[1]), now)
        elif kind == "reconcile":
            self._timers.at(key, now + self.config.scan.reconcile_interval)
            for source in self._sources.values():
                for tier in source.tiers:
                    self._want_full_read(tier, now)
        elif kind == "node":
            self._refresh_node()
            self._timers.at(key, now + NODE_REFRESH_SECONDS)
        elif kind == "health":
            self._health = None
            self._republish = True

    # --- watcher callbacks (other threads) ---------------------------------------------------

    def _changed(self, key: str, path: str) -> None:
        self._post(("changed", key, path))

    def _overflowed(self, path: str | None) -> None:
        self._post(("overflowed", path))

    def _lost(self, key: str, reason: str) -> None:
        self._post(("lost", key, reason))

    def _on_changed(self, name: str, path: str) -> None:
        source = self._sources.get(name)
        if source is None:
            return
        now = self.monotonic()
        tiers = [t for t in source.tiers if _contains(t.path, path)] or source.tiers
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
                if path is None or _contains(tier.path, path) or _contains(path, tier.path):
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

    def _want_full_read(self, tier: _Tier, now: float) -> None:
        tier.reconcile_wanted += 1
        self._timers.soon(tier.key, now)

    # --- jobs --------------------------------------------------------------------------------

    def _add(
        self,
        name: str,
        paths: tuple[WatchedPath, ...],
        policy: Policy,
        discovered_from: str | None,
        job_config: JobConfig | None = None,
    ) -> None:
        # A discovered job's directory belongs to a tenant: never followed if it is (or
        # becomes) a symlink. A configured root may be one, as the operator chose.
        follow = None if discovered_from is None else False
        tiers = [
            _Tier(
                name,
                watched.tier,
                watched.path,
                follow,
                self._lexical_mount(watched.path),
                scope=_configured_scope(watched.tier, policy),
            )
            for watched in paths
        ]
        fixed = None if policy.layout == "auto" else policy.layout
        source = _Source(name, policy, tiers, fixed, discovered_from, config=job_config)
        self._sources[name] = source
        if name not in self.tracker.jobs:
            self.tracker.add(JobTracker(name, paths, policy, first_seen=self.clock()))
            earlier = self._lives.pop(name, None)
            if earlier is not None:
                self.tracker.jobs[name].take_life(earlier)
        # One counter for what the reader refused and what the job's clocks gave up.
        self.tracker.jobs[name].clocks.dropped = self.spool.dropped_total
        self._publish_paths(source)
        for tier in tiers:
            if self._outside(tier):
                continue  # not even placed: placing stats the path
            self._worker(tier.worker).submit(
                lambda tier=tier: self._place(tier, policy), name=f"place {tier.path}"
            )
            # Placing stats the path: a mount hung before the start is found stuck here.
            self._timers.soon(("stuck", tier.worker), self.monotonic() + STUCK_SECONDS)
        self._health = self._reserves = None

    def _remove(self, name: str) -> None:
        source = self._sources.pop(name, None)
        self.tracker.forget(name)
        self._changed_jobs.add(name)
        self._held.discard(name)
        self._timers.cancel(("job", name))
        for tier in source.tiers if source is not None else ():
            self._timers.cancel(tier.key)
        if self.watcher is not None:
            self.watcher.unwatch(name)
        self._health = self._reserves = None

    def _lexical_mount(self, path: str) -> str:
        """The mount ``path`` lies on by its name alone: resolving symlinks would stat it, and
        the core never waits on a filesystem. Its worker then places it for real."""
        mount = mount_of_name(os.path.abspath(path), self._mounts)
        return mount.mountpoint if mount is not None else ""

    def _worker(self, mountpoint: str) -> MountWorker:
        worker = self._workers.get(mountpoint)
        if worker is None:
            worker = self._workers[mountpoint] = self._worker_factory(mountpoint, self._post)
            validator = Validator(
                self._limits, self._verdicts, self._wake.set, name=f"validator {mountpoint}"
            )
            self._validators[mountpoint] = validator
            if self._started and not self._stop.is_set():  # one added while stopping stays idle
                worker.start()
                validator.start()
            self._health = None
        return worker

    def _place(self, tier: _Tier, policy: Policy) -> _Placed:
        """On the tier's worker: its mount, how it is watched, its reader (all may stat it)."""
        mount = mount_of(tier.path, self._mounts)
        # Shared storage gets the budget whether it is polled or (configured so) watched.
        network = mount is not None and is_network(mount.fstype)
        scope = tier.scope or (SHARED if network else NODE)
        if not self.serving.serves(scope, tier.job):
            return _Placed(tier, mount, "", "", None, scope)
        mode, reason = choose_mode(policy.watch, mount)
        reader = TreeReader(
            tier.path,
            self._network_budget if network else self._local_budget,
            layouts.ALL_CONTENT_FILES,
            self.config.scan.max_depth,
            marker_names=layouts.MARKER_NAMES,
            marker_suffixes=layouts.MARKER_SUFFIXES,
            follow_root_symlink=tier.follow_root,
            root_marker=layouts.ROOT_MARKER,
        )
        if mode == INOTIFY and self.watcher is not None:
            failure = self.watcher.watch(
                tier.job,
                tier.path,
                max_depth=self.config.scan.max_depth,
                follow_root_symlink=tier.follow_root is not False,  # a tenant's root: never
            )
            if failure is not None:
                mode, reason = POLL, failure
                log.warning("job=%s path=%s: %s; polling instead", tier.job, tier.path, failure)
        return _Placed(tier, mount, mode, reason, reader, scope)

    def _placed(self, placed: _Placed) -> None:
        tier = placed.tier
        self._unstick(tier.worker)  # its worker answered
        source = self._sources.get(tier.job)
        if source is None and self.watcher is not None:
            self.watcher.unwatch(tier.job)  # removed while placed: the watch it added goes too
        if source is None or tier not in source.tiers:
            return  # removed meanwhile
        tier.scope = placed.scope
        if placed.reader is None:
            log.info("not watching job=%s tier=%s path=%s: scope %s, outside this process's (%s)",
                     tier.job, tier.tier, tier.path, tier.scope,
                     self.serving.scope_label)  # fmt: skip
            self._publish_paths(source)
            self._health = None
            return
        tier.mode, tier.reason, tier.reader = placed.mode, placed.reason, placed.reader
        if placed.mount is not None:
            tier.mountpoint = placed.mount.mountpoint
            if tier.mountpoint != tier.worker:  # reached through a symlink to another mount
                tier.worker = tier.mountpoint
                self._worker(tier.worker)
        if self.telemetry is not None:
            placement = self.telemetry.place(tier.path, placed.mount)
            tier.disk = placement.block_device.name if placement.block_device else None
        log.info("watching job=%s tier=%s path=%s mode=%s (%s)",
                 tier.job, tier.tier, tier.path, tier.mode, tier.reason)  # fmt: skip
        self._publish_paths(source)
        self._reserves = None
        if tier.mode == INOTIFY:
            self._timers.soon(("probe", tier.worker), self.monotonic() + PROBE_SECONDS)
        self._timers.soon(tier.key, self.monotonic())

    def _publish_paths(self, source: _Source) -> None:
        self.tracker.jobs[source.name].set_paths(
            tuple(
                WatchedPath(
                    t.tier, t.path, t.mode, t.mountpoint, scanned=self._read_here(t),
                    missing=t.missing, unreadable=t.unreadable,
                )
                for t in source.tiers
            )
        )  # fmt: skip
        self._changed_jobs.add(source.name)

    def _outside(self, tier: _Tier) -> bool:
        """The tier's scope is known, and this process does not serve it (for this job)."""
        return bool(tier.scope) and not self.serving.serves(tier.scope, tier.job)

    def _read_here(self, tier: _Tier) -> bool:
        """Its series come from this process: its scope is served, or, while ``auto`` waits for
        the tier to be placed, every scope it could turn out to have is."""
        if tier.scope:
            return self.serving.serves(tier.scope, tier.job)
        return all(self.serving.serves(scope, tier.job) for scope in (NODE, SHARED))

    def _discover(self, index: int, now: float) -> None:
        if index >= len(self._discoveries):
            return
        discovery = self._discoveries[index]
        if not self._lists(discovery.entry):
            return
        self._timers.at(("discover", str(index)), now + discovery.entry.policy.poll_interval)
        if discovery.listing:
            return
        if discovery.entry.policy.scope == SHARED and SHARED not in self.serving.scopes:
            # A node-scope process never touches a shared root, not even to list it: the jobs
            # whose ranks run here are the ones writing into this node's spool. Any user may
            # make a directory there: one with no spool file is a mkdir, no job (it takes no
            # max_jobs slot), and the jobs are dated by their last write, newest first.
            found = [
                _Candidate(job, listed.mtime, not listed.spool_files)
                for job, listed in sorted(self.spool.listed().items())
            ]
            self._listed(_Listed(discovery, found))
            return
        root = str(discovery.entry.root)
        worker = self._worker(self._lexical_mount(root))
        if worker.stuck:
            return
        discovery.listing = True
        known = frozenset(n for n, src in self._sources.items() if src.discovered_from == root)
        worker.submit(
            lambda: _list_jobs(discovery, root, known),
            name=f"list discover root {root}",
            fallback=lambda _: _Listed(discovery, None),  # listed again at its next poll
        )
        self._timers.soon(("stuck", worker.mountpoint), now + STUCK_SECONDS)

    def _lists(self, entry: DiscoverConfig) -> bool:
        """Whether this process discovers jobs under the root: a root of node scope is left to
        the node-scope processes; a node-scope process learns the names under a shared root from
        its spool, under an auto one by listing it."""
        return entry.policy.scope != NODE or NODE in self.serving.scopes

    def _listed(self, listed: _Listed) -> None:
        discovery = listed.discovery
        self._unstick(self._lexical_mount(str(discovery.entry.root)))  # its worker answered
        discovery.listing = False
        if not discovery.listed:
            discovery.listed = True
            self._health = None
        if discovery not in self._discoveries:
            return
        entry = discovery.entry
        root = str(entry.root)
        if listed.missing != discovery.missing:
            discovery.missing, self._republish = listed.missing, True
            log.warning("discover root %s %s", root, "does not exist: watched from when it appears"
                        if listed.missing else "exists now")  # fmt: skip
        if listed.found is None:
            return
        configured = {job.name for job in self.config.jobs}
        present = {
            c.name: c
            for c in listed.found
            if _JOB_NAME.fullmatch(c.name)
            and c.name not in configured
            and self.serving.tracks(c.name)
        }
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
        # Not watched yet (a name found under another root stays there), newest first; an
        # empty directory is no job yet and takes no slot, so a tenant's mkdirs cannot fill them.
        displaced = discovery.displaced
        for name in [n for n in displaced if n not in present or present[n].mtime > displaced[n]]:
            del displaced[name]  # gone, or written since: a candidate like any other
        candidates = sorted(
            (c for n, c in present.items() if n not in self._sources and not c.empty),
            key=lambda c: (c.name in displaced, -c.mtime, c.name),
        )
        slots = max(0, entry.max_jobs - len(tracked))
        waiting = [c for c in candidates[slots:] if c.name not in displaced]
        slots += self._make_room(discovery, tracked, waiting, present)
        for candidate in candidates[:slots]:
            path = os.path.join(root, candidate.name)
            self._add(candidate.name, (WatchedPath(DURABLE, path),), entry.policy, root)
        excess = len(candidates) - min(slots, len(candidates))
        if excess != discovery.excess:
            discovery.excess = excess
            self._republish = True
        for candidate in candidates[slots:]:
            if candidate.name not in discovery.reported:
                discovery.reported.add(candidate.name)
                log.warning(
                    "discover root %s: job %s is over max_jobs=%d and is not watched",
                    root, candidate.name, entry.max_jobs,
                )  # fmt: skip

    def _make_room(
        self,
        discovery: _Discovery,
        tracked: list[str],
        waiting: list[_Candidate],
        present: dict[str, _Candidate],
    ) -> int:
        """Over max_jobs, the oldest idle jobs (finished, or silent since before their next save
        was due, no save in progress) give their slots to newer jobs, the newest first: a root
        full of finished runs still watches the run started today. Returns the slots freed."""
        entry = discovery.entry
        idle = sorted(
            (self._last_activity(name), name) for name in tracked if self._idle(name, entry)
        )
        freed = 0
        for candidate in waiting:
            if not idle or idle[0][0] >= candidate.mtime:
                break
            since, name = idle.pop(0)
            log.warning(
                "discover root %s: over max_jobs=%d, job %s (idle since %s) makes room for %s",
                entry.root, entry.max_jobs, name, time.strftime("%Y-%m-%dT%H:%M:%SZ",
                time.gmtime(since)), candidate.name,
            )  # fmt: skip
            if name in present:  # not a run gone from the root, kept until forget_after
                discovery.displaced[name] = present[name].mtime
            self._remove(name)
            freed += 1
        return freed

    def _last_activity(self, name: str) -> float:
        job = self.tracker.jobs[name]
        return job.alive_at if job.alive_at is not None else job.first_seen

    def _idle(self, name: str, entry: DiscoverConfig) -> bool:
        job = self.tracker.jobs[name]
        if job.has_saves_in_progress():
            return False
        silent = self.clock() - self._last_activity(name)
        return job.finished or silent > entry.policy.interval + entry.policy.deadline

    # --- reading -----------------------------------------------------------------------------

    def _scan_due(self, name: str, tier_name: str, now: float) -> None:
        source = self._sources.get(name)
        tier = next((t for t in source.tiers if t.tier == tier_name), None) if source else None
        if tier is None or tier.reader is None:
            return  # gone, or not placed yet (placing schedules its first read)
        if tier.pending or self._workers[tier.worker].stuck:
            tier.again = True  # read once the one under way (or stuck) returns
            return
        if now < tier.retry_at:
            self._timers.soon(tier.key, tier.retry_at)
            return
        self._submit_read(source, tier, now)

    def _submit_read(
        self, source: _Source, tier: _Tier, now: float, final: Sequence[str] = ()
    ) -> None:
        assert tier.reader is not None
        job = self.tracker.jobs[source.name]
        hot = job.hot_directories(tier.tier)
        reconcile = 0 if final else tier.reconcile_wanted
        force = reconcile > tier.reconcile_done
        touched = () if final else _below(tier.path, tier.touched)
        if not final:
            tier.touched = set()
        tier.pending, tier.again = True, False
        options = Options(verify_checksums=source.policy.verify_checksums)
        fixed = source.fixed_layout

        def read() -> _Read:
            return _read_tier(tier, hot, force, reconcile if force else 0, touched, final,
                              fixed, options)  # fmt: skip

        self._reads.setdefault(tier.worker, []).append((read, tier))
        self._timers.soon(("stuck", tier.worker), now + STUCK_SECONDS)

    def _send_reads(self) -> None:
        """Hand each worker the reads this turn asked of it as one task: a thread wakes once per
        turn, not once per tier (polls fall due together on the POLL_GRID)."""
        for mountpoint, reads in self._reads.items():
            readers = [tier.reader for _, tier in reads if tier.reader is not None]
            tiers = [tier for _, tier in reads]

            def progress(readers: list[TreeReader] = readers) -> int:
                return sum(reader.entries_read for reader in readers)

            def batch(reads: list[tuple[Callable[[], _Read], _Tier]] = reads) -> list[_Read]:
                return [read() for read, _ in reads]

            def failed(error: Exception, tiers: list[_Tier] = tiers) -> list[_Read]:
                # Each tier's read failed: read again in full after a pause, as a read that
                # raised on its own is.
                return [_failed_read(tier, error) for tier in tiers]

            self._workers[mountpoint].submit(
                batch, progress, name=f"read {len(reads)} tiers", fallback=failed
            )
        self._reads = {}

    def _read_done(self, result: _Read) -> None:
        tier = result.tier
        tier.pending = False
        self._unstick(tier.worker)
        source = self._sources.get(tier.job)
        if source is None or tier not in source.tiers:
            return  # removed while read
        now, wall = self.monotonic(), self.clock()
        name = source.name
        job = self.tracker.jobs[name]
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
            self._held.discard(name)
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
        observed = job.observe(tier.tier, result.found, wall, result.unreadable, result.layout)
        if observed.just_committed and not result.final:
            # Sizes were last statted mid-write: one full read of what just committed, and the
            # job's published state waits for it.
            committed = ["" if gen_id == "." else gen_id for gen_id in observed.just_committed]
            self._held.add(name)
            self._submit_read(source, tier, now, final=committed)
        else:
            self._held.discard(name)
        validator = self._validators[tier.worker]
        for request in observed.requests:
            job.submitted(request)
            validator.submit(request, tier.path, tier.reader.follow_root_symlink, tier.reader.tree)
        self._changed_jobs.add(name)
        self._schedule_job(name, now, wall)
        if not tier.pending:
            self._schedule_read(source, tier, now)
        self._health_changed()

    def _schedule_read(self, source: _Source, tier: _Tier, now: float) -> None:
        """The tier's next read: now if asked for meanwhile, else its poll or hot re-read."""
        if tier.again or tier.reconcile_wanted > tier.reconcile_done:
            self._timers.at(tier.key, now)
            return
        due = []
        if tier.mode == POLL:
            due.append(_on_grid(tier.last_read + source.policy.poll_interval))
        if self.tracker.jobs[source.name].has_saves_in_progress():
            due.append(tier.last_read + HOT_RESCAN_SECONDS)
        if due:
            self._timers.at(tier.key, min(due))
        else:
            self._timers.cancel(tier.key)

    def _check_stuck(self, mountpoint: str, now: float) -> None:
        worker = self._workers.get(mountpoint)
        if worker is None:
            return
        stalled = worker.stalled_for(now)
        if stalled == 0.0:
            self._unstick(mountpoint)  # whatever it was stuck on has returned
            if any(t.pending and t.worker == mountpoint for t in self._all_tiers()):
                self._timers.at(("stuck", mountpoint), now + STUCK_SECONDS)  # between two tasks
            return
        if stalled >= STUCK_SECONDS:
            if not worker.stuck:
                worker.stuck = True
                log.error("filesystem %s is stuck: no answer for %.0f s; its jobs wait for it",
                          mountpoint or "(unknown mount)", stalled)  # fmt: skip
                self._health = None
            self._timers.at(("stuck", mountpoint), now + STUCK_SECONDS)
        else:
            self._timers.at(("stuck", mountpoint), now + STUCK_SECONDS - stalled)

    def _unstick(self, mountpoint: str) -> None:
        worker = self._workers.get(mountpoint)
        if worker is None or not worker.stuck:
            return
        worker.stuck = False
        log.warning("filesystem %s answers again", mountpoint or "(unknown mount)")
        self._health = None
        now = self.monotonic()
        for source in self._sources.values():
            for tier in source.tiers:
                if tier.worker == mountpoint and tier.again and not tier.pending:
                    self._timers.soon(tier.key, now)

    def _all_tiers(self) -> list[_Tier]:
        return [tier for source in self._sources.values() for tier in source.tiers]

    def _probe(self, mountpoint: str, now: float) -> None:
        """Confirm an inotify-watched filesystem still answers (its tiers are not re-read)."""
        roots = [
            tier.path
            for source in self._sources.values()
            for tier in source.tiers
            if tier.worker == mountpoint and tier.mode == INOTIFY
        ]
        worker = self._workers.get(mountpoint)
        if not roots or worker is None:
            return
        self._timers.at(("probe", mountpoint), now + PROBE_SECONDS)
        if worker.stuck:
            return
        worker.submit(
            lambda: _probe_path(mountpoint, roots[0], self.clock), name=f"probe {roots[0]}"
        )
        self._timers.soon(("stuck", mountpoint), now + STUCK_SECONDS)

    def _probed(self, probe: _Probed) -> None:
        self._unstick(probe.worker)
        for source in self._sources.values():
            for tier in source.tiers:
                if (
                    tier.worker == probe.worker
                    and tier.mode == INOTIFY
                    and tier.first_done
                    and not tier.pending
                    and tier.failures == 0
                ):
                    tier.confirmed = max(tier.confirmed, probe.at)
        self._health_changed()

    # --- jobs' own timers ----------------------------------------------------------------------

    def _schedule_job(self, name: str, now: float, wall: float) -> None:
        """Arm the job's timer for when its tracker (or its telemetry window) is next due."""
        job = self.tracker.jobs.get(name)
        if job is None:
            return
        due = job.next_due(wall)
        if self._correlating and job.last_window is not None:
            start, end = job.last_window
            done = job.window_telemetry
            if done is None or (done.start, done.end) != (start, end):
                ready = end + 1.5 * self.config.telemetry.sample_interval
                due = ready if due is None else min(due, ready)
        if due is None:
            self._timers.cancel(("job", name))
        else:  # on the monotonic clock; never in the past, so a timer cannot spin
            self._timers.at(("job", name), now + max(0.01, due - wall))

    def _job_due(self, name: str, now: float) -> None:
        job = self.tracker.jobs.get(name)
        source = self._sources.get(name)
        if job is None or source is None:
            return
        wall = self.clock()
        version = job.version
        job.tick(wall)
        if job.validation_retry_due(wall):
            for tier in source.tiers:
                self._timers.soon(tier.key, now)
        self._correlate(source, job, wall)
        if job.version != version:
            self._changed_jobs.add(name)
        self._schedule_job(name, now, wall)

    def _correlate(self, source: _Source, job: JobTracker, wall: float) -> None:
        """Attach to the job's newest finished save what this node's devices did during it,
        once the samples after its end are in."""
        if not self._correlating or self.telemetry is None or job.last_window is None:
            return
        settle = 1.5 * self.config.telemetry.sample_interval
        start, end = job.last_window
        done = job.window_telemetry
        if (done is not None and (done.start, done.end) == (start, end)) or wall < end + settle:
            return
        disks = {tier.disk for tier in source.tiers if tier.disk}
        # The diagnosis (staging_bound) asks whether the network was quiet while training was
        # held before the payload moved: the same counters over that part of the window.
        stall = job.stall_window()
        held = None
        if stall is not None and stall[0] == start and stall[1] > start:
            held = self.telemetry.correlate(start, stall[1], disks).network_transmit_bytes
        job.set_window_telemetry(self.telemetry.correlate(start, end, disks), held)

    def _check_spool(self) -> None:
        """Whether training jobs can write the spool: it exists, and any user (or its group) may
        make a directory in it. The kubelet makes a missing hostPath root 0755, and then every
        non-root job's events are lost after one warning in its own log."""
        try:
            mode = os.stat(self.config.spool).st_mode
        except OSError as error:
            writable, why = False, error.strerror or str(error)
        else:
            others = mode & (stat.S_IWOTH | stat.S_IXOTH) == stat.S_IWOTH | stat.S_IXOTH
            group = mode & (stat.S_IWGRP | stat.S_IXGRP) == stat.S_IWGRP | stat.S_IXGRP
            writable = stat.S_ISDIR(mode) and (others or group)
            why = f"mode {stat.filemode(mode)}; make it 1733 (chmod 1733)"
        if writable != self._spool_writable:
            self._spool_writable, self._republish = writable, True
            if not writable:
                log.warning("spool %s cannot be written by training jobs (%s): their save "
                            "clocks are lost", self.config.spool, why)  # fmt: skip

    def _spool_owners(self) -> Mapping[str, frozenset[int] | None]:
        """The jobs tracked here, each with the uids its spool directories may belong to (see
        ``_spool_owner``), worked out per job when the spool asks about it."""
        return _SpoolOwners(self)

    def _spool_owner(self, name: str, stuck: Collection[str]) -> frozenset[int] | None:
        """A job's ``spool_owner``, else the owners of its trees read here (root's tells nothing:
        it makes directories for anyone); None where neither says; HOLD until such a tree is
        first read (unless its mount is ``stuck``), so no squatter's history slips in at
        start-up."""
        source = self._sources.get(name)
        if source is None:
            return None
        tiers = [t for t in source.tiers if not self._outside(t)]
        if source.policy.spool_owner:
            return frozenset(source.policy.spool_owner)
        if any(not t.first_done and t.worker not in stuck for t in tiers):
            return HOLD
        uids = {t.reader.root_owner for t in tiers if t.reader is not None}
        return frozenset(uid for uid in uids if uid) or None

    def _read_spool(self) -> None:
        now = self.monotonic()
        if now >= self._spool_checked + SPOOL_CHECK_SECONDS:
            self._spool_checked = now
            self._check_spool()
        before = self.spool.poll_seconds_total
        by_job: dict[str, list[Event]] = {}
        for event in self.spool.poll(self.clock()):
            by_job.setdefault(event.training_job, []).append(event)
        if self.spool.poll_seconds_total != before:
            self._republish = True
        now, wall = self.monotonic(), self.clock()
        for name, events in by_job.items():
            job = self.tracker.jobs.get(name)
            if job is not None:
                job.apply_events(events, wall)
                self._changed_jobs.add(name)
                self._schedule_job(name, now, wall)

    def _apply_verdicts(self) -> None:
        now, wall = self.monotonic(), self.clock()
        while True:
            try:
                request, verdict = self._verdicts.get_nowait()
            except queue.Empty:
                return
            job = self.tracker.jobs.get(request.job)
            source = self._sources.get(request.job)
            if job is None or source is None:
                continue
            if verdict is None:
                job.retry_validation(request)
                for tier in source.tiers:  # read again: the move shows up, or it is judged again
                    if tier.tier == request.tier:
                        self._timers.soon(tier.key, now)
            elif verdict.unchecked:
                job.retry_validation(request, wall + RETRY_UNCHECKED_SECONDS)
            else:
                job.apply_verdict(request, verdict)
            self._changed_jobs.add(request.job)
            self._schedule_job(request.job, now, wall)

    # --- configuration reload ------------------------------------------------------------------

    def _apply_config(self, config: Config) -> None:
        """Jobs added, removed or changed take effect; an unchanged job keeps its state."""
        not_applied = _restart_only_changes(self.config, config)
        if not_applied:
            log.warning("configuration reloaded without %s: changed there, applied at the next "
                        "restart", ", ".join(not_applied))  # fmt: skip
        # Mounts made since the start (autofs, a new NFS export) decide where new jobs live.
        self._mounts = read_mounts(self.config.paths.procfs)
        wanted = {job.name: job for job in config.jobs if self.serving.tracks(job.name)}
        added, removed, changed = [], [], []
        for name, source in list(self._sources.items()):
            if source.discovered_from is None and name not in wanted:
                removed.append(name)
                self._remove(name)
        for name, job in wanted.items():
            source = self._sources.get(name)
            if source is not None and source.config == job:
                continue
            earlier = self.tracker.jobs.get(name) if source is not None else None
            if source is not None:
                changed.append(name)
                self._remove(name)
            else:
                added.append(name)
            self._add(name, job_paths(job), job.policy, None, job)
            if earlier is not None:
                self.tracker.jobs[name].take_life(earlier)
        roots = {str(d.entry.root): d for d in self._discoveries}
        # A root whose entry changed (its policy, max_jobs): its jobs are found again under it.
        changed_roots = {
            str(entry.root)
            for entry in config.discover
            if str(entry.root) in roots and roots[str(entry.root)].entry != entry
        }
        self._discoveries = [
            d if d.entry == entry else _Discovery(entry)
            for entry in config.discover
            for d in [roots.get(str(entry.root), _Discovery(entry))]
        ]
        kept_roots = {str(d.entry.root) for d in self._discoveries}
        for name, source in list(self._sources.items()):
            if source.discovered_from is not None and (
                source.discovered_from not in kept_roots
                or source.discovered_from in changed_roots
                or name in wanted
            ):
                if source.discovered_from in changed_roots and name in self.tracker.jobs:
                    self._lives[name] = self.tracker.jobs[name]  # found again under its root
                self._remove(name)
        now = self.monotonic()
        for index in range(len(self._discoveries)):
            self._timers.soon(("discover", str(index)), now)
        self.config = replace(self.config, jobs=config.jobs, discover=config.discover)
        self._reload = (True, self.clock())
        self._republish = True
        log.info("configuration reloaded: jobs added=%s removed=%s changed=%s",
                 ",".join(added) or "none", ",".join(removed) or "none",
                 ",".join(changed) or "none")  # fmt: skip

    # --- publishing ----------------------------------------------------------------------------

    def _health_changed(self) -> None:
        """Per-tier view ages moved: republished within HEALTH_REFRESH_SECONDS (not per read)."""
        if self._timers.due_at(("health",)) is None and self._health is not None:
            self._timers.at(("health",), self.monotonic() + HEALTH_REFRESH_SECONDS)

    def _health_state(self) -> tuple[object, ...]:
        if self._health is None:
            tiers = [
                (s.name, t) for s in self._sources.values() for t in s.tiers if not self._outside(t)
            ]
            stuck = {key for key, worker in self._workers.items() if worker.stuck}
            if not self._ready:
                unlisted = sum(
                    1
                    for d in self._discoveries
                    if not d.listed
                    and self._lists(d.entry)
                    and self._lexical_mount(str(d.entry.root)) not in stuck
                )
                done = sum(1 for _, t in tiers if t.first_done or t.worker in stuck)
                roots = f", {unlisted} discover roots not listed yet" if unlisted else ""
                self._not_ready = f"first pass not finished ({done} of {len(tiers)} tiers{roots})"
                self._ready = not unlisted and done == len(tiers)
                if self._ready:
                    log.info("ready: every watched tier has been read once")
            first_scans = tuple(
                sorted((name, t.tier, t.first_done, _entries(t)) for name, t in tiers)
            )
            mounts = tuple(sorted((key, worker.stuck) for key, worker in self._workers.items()))
            success = tuple(sorted((name, t.tier, t.confirmed) for name, t in tiers if t.confirmed))
            self._health = (self._ready, first_scans, mounts, success)
            if not self._ready:  # the first pass's progress moves without telling the core
                self._timers.soon(("health",), self.monotonic() + PROGRESS_REFRESH_SECONDS)
            self._republish = True
        return self._health

    def _refresh_node(self) -> None:
        if self.telemetry is None:
            return
        if self._reserves is None:
            reserves: dict[str, float] = {}
            for source in self._sources.values():
                for tier in source.tiers:
                    if tier.mountpoint:
                        reserves[tier.mountpoint] = max(
                            reserves.get(tier.mountpoint, 0.0), source.policy.capacity_reserve
                        )
            self._reserves = reserves
        node = (self.telemetry.filesystems(self._reserves), self.telemetry.available())
        if node != self._node:
            self._node = node
            self._republish = True

    def _publish(self) -> None:
        health = self._health_state()
        if not (self._republish or self._changed_jobs):
            return
        ready, first_scans, mounts, success = health
        reload_ok, reload_time = self._reload
        daemon = DaemonState(
            scans=self._scans.state(),
            metadata_operations=self._network_budget.total + self._local_budget.total,
            watch_overflows=self._overflows,
            scan_errors=self._scan_errors,
            spool_events=tuple(sorted(self.spool.events_total.items())),
            spool_invalid=tuple(sorted(self.spool.invalid_total.items())),
            spool_dropped=tuple(sorted(self.spool.dropped_total.items())),
            spool_dropped_bytes=tuple(sorted(self.spool.dropped_bytes_total.items())),
            spool_squatted=tuple(sorted(self.spool.squatted.items())),
            spool_backlog_bytes=self.spool.backlog_bytes,
            spool_poll_seconds=self.spool.poll_seconds_total,
            discover_excess=tuple((str(d.entry.root), d.excess) for d in self._discoveries),
            discover_missing=tuple((str(d.entry.root), int(d.missing)) for d in self._discoveries),
            spool_writable=self._spool_writable,
            ready=bool(ready),
            shard_info=None
            if self.serving.default
            else (self.serving.shard, self.serving.shards, self.serving.scope_label),
            first_scans=first_scans,  # type: ignore[arg-type]
            mounts=mounts,  # type: ignore[arg-type]
            scan_success=success,  # type: ignore[arg-type]
            config_reload_successful=reload_ok,
            config_reload_success_time=reload_time,
            worker_task_failures=tuple(sorted(self._task_failures.items())),
        )
        if self.telemetry is None:
            self.tracker.publish(daemon, changed=self._changed_jobs, held=self._held)
        else:
            filesystems, available = self._node
            self.tracker.publish(
                daemon, filesystems, available, changed=self._changed_jobs, held=self._held
            )
        self._changed_jobs = set()
        self._republish = False


# --- tasks that run on a filesystem's worker ------------------------------------------------------


def _restart_only_changes(old: Config, new: Config) -> list[str]:
    """The top-level config sections a reload changed but does not apply (all but the jobs and
    the discover roots: the listener, the spool, scan budgets and telemetry are set up once)."""
    return [
        name
        for name in (f.name for f in fields(Config))
        if name not in ("jobs", "discover", "defaults", "source")
        and getattr(old, name) != getattr(new, name)
    ]


def _read_tier(
    tier: _Tier,
    hot: list[str],
    force: bool,
    reconcile: int,
    touched: Collection[str],
    final: Sequence[str],
    fixed_layout: str | None,
    options: Options,
) -> _Read:
    started = time.perf_counter()
    reader = tier.reader
    assert reader is not None
    try:
        if final:
            tree, stats = reader.read(hot, force_paths=final)
        else:
            tree, stats = reader.read(hot, force=force, touched=touched)
        found, layout = _found(tier, tree, fixed_layout, options)
    except Exception as error:
        return _failed_read(tier, error, time.perf_counter() - started, bool(final))
    unreadable = frozenset(path for path, _ in stats.errors)
    return _Read(tier, found, unreadable, len(stats.errors), layout,
                 time.perf_counter() - started, reconcile, bool(final),
                 missing=tree is None and not stats.errors)  # fmt: skip


def _failed_read(tier: _Tier, error: Exception, seconds: float = 0.0, final: bool = False) -> _Read:
    return _Read(tier, [], frozenset(), 0, None, seconds, 0, final, error)


def _found(
    tier: _Tier, tree: object, fixed_layout: str | None, options: Options
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


def _configured_scope(tier: str, policy: Policy) -> str:
    """A tier's scope as the config sets it ("" for auto: its mount decides). ``scope`` names
    the durable tier's; a staging tier is always scoped from its mount."""
    return policy.scope if tier == DURABLE and policy.scope != "auto" else ""


def _list_jobs(discovery: _Discovery, root: str, known: frozenset[str]) -> _Listed:
    """The subdirectories of a discover root (never following a symlink), each with its mtime;
    the ones not watched yet are looked into, to tell an empty directory from a job."""
    try:
        fd = fsread.open_directory(root, follow_symlink=True)  # the operator's root
    except FileNotFoundError:
        return _Listed(discovery, None, missing=True)
    except OSError as error:
        log.warning("cannot list discover root %s: %s", root, error.strerror)
        return _Listed(discovery, None)
    found = []
    try:
        with os.scandir(fd) as listing:
            entries = [e for e in listing if e.is_dir(follow_symlinks=False)]
        for entry in entries:
            with contextlib.suppress(OSError):  # gone or swapped since listed: next time
                mtime = entry.stat(follow_symlinks=False).st_mtime
                empty = entry.name not in known and _empty(fd, entry.name)
                found.append(_Candidate(entry.name, mtime, empty))
    except OSError as error:
        log.warning("cannot list discover root %s: %s", root, error.strerror)
        return _Listed(discovery, None)
    finally:
        os.close(fd)
    return _Listed(discovery, found)


def _empty(root_fd: int, name: str) -> bool:
    child = fsread.open_directory(name, dir_fd=root_fd)  # O_NOFOLLOW: a symlink raises
    try:
        with os.scandir(child) as listing:
            return next(iter(listing), None) is None
    finally:
        os.close(child)


def _probe_path(mountpoint: str, path: str, clock: Callable[[], float]) -> _Probed:
    with contextlib.suppress(OSError):  # an error is an answer all the same
        os.stat(path)
    return _Probed(mountpoint, clock())


def _on_grid(due: float) -> float:
    """The next POLL_GRID tick at or after ``due``."""
    return math.ceil(due / POLL_GRID) * POLL_GRID


def _entries(tier: _Tier) -> int:
    """Entries the tier's first pass read: so far while it runs."""
    if tier.first_done:
        return tier.first_entries
    return tier.reader.entries_read if tier.reader is not None else 0


def _below(root: str, paths: Collection[str]) -> list[str]:
    """The paths inside ``root``, relative to it (the root itself left out)."""
    prefix = root.rstrip("/") + "/"
    return [path[len(prefix) :] for path in paths if path.startswith(prefix)]


def _contains(parent: str, child: str) -> bool:
    parent = parent.rstrip("/")
    return child == parent or child.startswith(parent + "/")


class _SpoolOwners(Mapping[str, "frozenset[int] | None"]):
    """The spool's view of the jobs tracked here, at one poll: membership and iteration are the
    tracker's jobs, an owner is worked out only for the job asked about. The spool asks about
    the directories it sees, five times a second; a mapping built for every job at every poll
    made 1,000 idle jobs cost eight times the CPU of 10."""

    def __init__(self, scanner: Scanner) -> None:
        self._scanner = scanner
        self._stuck: frozenset[str] | None = None

    def __getitem__(self, name: str) -> frozenset[int] | None:
        if name not in self._scanner.tracker.jobs:
            raise KeyError(name)
        if self._stuck is None:
            workers = self._scanner._workers.items()
            self._stuck = frozenset(mountpoint for mountpoint, w in workers if w.stuck)
        return self._scanner._spool_owner(name, self._stuck)

    def __contains__(self, name: object) -> bool:
        return name in self._scanner.tracker.jobs

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._scanner.tracker.jobs))

    def __len__(self) -> int:
        return len(self._scanner.tracker.jobs)
