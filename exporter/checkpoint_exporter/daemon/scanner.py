"""The daemon's core: one thread that owns every job's state, fed by per-filesystem workers.

Nothing walks all jobs on a fixed tick. The core thread sleeps until the earliest timer in its
queue (``daemon.timers``) or until something arrives: a watch event, a worker's result, a
verdict. What it then does costs what is due:

- a watch event schedules a read of the job's tier (coalesced for ``COALESCE_SECONDS``: a save's
  shards arrive as a stream of events); a polled tier (network filesystems) is read every
  ``poll_interval``; a job with a save in progress is read once a second (to see progress,
  settling and aborts); a full reconcile comes every ``scan.reconcile_interval`` and after an
  inotify queue overflow;
- a job's own timer (its ``Effects.next_due``: abort deadlines, spool timelines to settle,
  unchecked generations to ask again, the telemetry window to correlate) fires only when set;
- the spool is polled on its own timer, every ``SPOOL_POLL_SECONDS``.

Every read of a watched path runs on the worker of its filesystem (``daemon.workers``), so a
hung mount stalls only its own jobs: a task that makes no progress for ``STUCK_SECONDS`` marks
the mount stuck (``DaemonState.mounts``), its jobs are not read again until the task returns,
and every other job keeps its latency. Workers hand back values (a scan result per tier); only
the core thread touches the trackers, by job name through ``Tracker`` (``apply``, ``state``,
``publish``, and ``start``/``life``/``forget`` for a job's lifecycle), never holding a
``JobTracker``; it acts on the ``Effects`` that ``apply`` returns (daemon/validation.py).
Validation reads run on a validator per filesystem, so a read hung on one mount holds up no
other mount's checks (a hung validation read is not itself reported).

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

import logging
import math
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable

from checkpoint_exporter.config import NODE, Config
from checkpoint_exporter.core.inputs import Effects
from checkpoint_exporter.core.jobs import Tracker, job_paths
from checkpoint_exporter.core.liveness import Life
from checkpoint_exporter.core.tracker import Histogram, ValidationRequest
from checkpoint_exporter.daemon.discovery import Discovering
from checkpoint_exporter.daemon.health import Health
from checkpoint_exporter.daemon.messages import (
    Changed,
    Listed,
    Lost,
    Overflowed,
    Placed,
    PlaceFailed,
    Probed,
    Read,
    Reload,
    ReloadFailed,
)
from checkpoint_exporter.daemon.placement import Placement
from checkpoint_exporter.daemon.reads import Reads
from checkpoint_exporter.daemon.reload import Reloading
from checkpoint_exporter.daemon.spooling import SpoolSide
from checkpoint_exporter.daemon.state import STUCK_SECONDS, Discovery, Probe, Source, Tier
from checkpoint_exporter.daemon.timers import (
    HEALTH_REFRESH,
    NODE_REFRESH,
    RECONCILE,
    SPOOL_POLL,
    DiscoverDue,
    JobDue,
    ProbeDue,
    ScanDue,
    StuckCheck,
    TimerKey,
    TimerQueue,
)
from checkpoint_exporter.daemon.validation import Validation
from checkpoint_exporter.daemon.validator import Validator
from checkpoint_exporter.daemon.workers import MountWorker, TaskFailed, WorkerFactory
from checkpoint_exporter.model import Verdict
from checkpoint_exporter.sources import dcp_metadata
from checkpoint_exporter.sources.listing import OpsBudget
from checkpoint_exporter.sources.object_store import RequestCounter
from checkpoint_exporter.sources.spool import SpoolReader
from checkpoint_exporter.sources.telemetry.node import NodeTelemetry
from checkpoint_exporter.sources.validate import Limits
from checkpoint_exporter.sources.watch import Watcher, read_mounts

# Re-exported: tests and tools import these from here.
__all__ = ["STUCK_SECONDS", "Scanner", "Validator"]

log = logging.getLogger(__name__)

SPOOL_POLL_SECONDS = 0.2  # the spool's cadence (it was read on every 0.2 s pass before)
# The loop turns at least this often even with nothing due, so liveness can tell idle from wedged.
HEARTBEAT_SECONDS = 5.0
# liveness fails when the loop has not turned for this long. A turn is in-memory work plus one
# spool poll (bounded at a few thousand lines): it takes milliseconds, and the loop never waits on
# a filesystem, so a minute without a turn is a wedged core, not a slow disk.
LIVENESS_SECONDS = 60.0
NODE_REFRESH_SECONDS = 1.0  # node telemetry (filesystems, what has data) republished this often
SCAN_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 120)


class Scanner(Placement, Discovering, Reads, Health, Validation, SpoolSide, Reloading):
    """The core: one thread owning every job's state (see the module's docstring); each part of
    its work is a module of its own, mixed in here, all sharing the state set up below."""

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
        self._timers: TimerQueue[TimerKey] = TimerQueue()
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
        self._sources: dict[str, Source] = {}
        self._discoveries = [Discovery(entry) for entry in config.discover]
        self._changed_jobs: set[str] = set()  # to publish
        self._reads: dict[str, list[tuple[Callable[[], Read], Tier]]] = {}  # to send
        # Per job, what its core asked for at its last input (JobTracker.apply): hot
        # directories, saves in progress, the next due time, a telemetry window to correlate.
        self._effects: dict[str, Effects] = {}
        # Jobs whose clocks refused events, and what forgotten jobs' refused (spool_dropped).
        self._dropping: set[str] = set()
        self._object_jobs: set[str] = set()  # jobs with a tier in object storage (health.py)
        # Their request counters by (job, tier), kept while the job is (placement.py).
        self._request_counters: dict[tuple[str, str], RequestCounter] = {}
        self._dropped_by_forgotten: Counter[str] = Counter()
        self._republish = True
        self._health: tuple[object, ...] | None = None  # ready, first_scans, mounts, scan_success
        self._ready = False
        self._not_ready = "first pass not started"
        self._reserves: dict[str, float] | None = None
        self._probes: dict[str, Probe] = {}  # by mountpoint (its worker's): its statvfs answers
        self._node: tuple[tuple, tuple | None] = ((), ())  # filesystems, telemetry with data
        self._reload: tuple[bool, float] = (True, self.clock())  # successful, success time
        self._spool_writable: bool | None = None  # checked where the spool is read
        # What a reload that changed a discover root knew of its jobs' lives, until each is found
        # again under it (a new tracker, the same job).
        self._lives: dict[str, Life] = {}
        self._spool_checked = -math.inf
        self._armed = False  # the first turn sets the timers that always run
        for job in config.jobs:
            if self.serving.tracks(job.name):
                self._add(job.name, job_paths(job), job.policy, None, job)

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
        self._post(Reload(config))

    def reload_failed(self) -> None:
        """The configuration file could not be loaded again: the running one stays."""
        self._post(ReloadFailed())

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
            self._timers.at(SPOOL_POLL, now)
        self._timers.at(RECONCILE, now + self.config.scan.reconcile_interval)
        self._timers.at(NODE_REFRESH, now)
        for index in range(len(self._discoveries)):
            self._timers.at(DiscoverDue(index), now)

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
        if NODE in self.serving.scopes and any(isinstance(i, (Read, list)) for i in items):
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
        elif isinstance(item, Read):
            self._read_done(item)
        elif isinstance(item, Placed):
            self._placed(item)
        elif isinstance(item, PlaceFailed):
            self._place_failed(item)
        elif isinstance(item, Listed):
            self._listed(item)
        elif isinstance(item, Probed):
            self._probed(item)
        elif isinstance(item, TaskFailed):
            self._task_failed(item)
        elif isinstance(item, Changed):
            self._on_changed(item.job, item.path)
        elif isinstance(item, Overflowed):
            self._on_overflowed(item.path)
        elif isinstance(item, Lost):
            self._on_lost(item.job, item.reason)
        elif isinstance(item, Reload):
            self._apply_config(item.config)
        elif isinstance(item, ReloadFailed):
            self._reload = (False, self._reload[1])
            self._republish = True

    def _due(self, key: TimerKey, now: float) -> None:
        if isinstance(key, ScanDue):
            self._scan_due(key.job, key.tier, now)
        elif isinstance(key, JobDue):
            self._job_due(key.job, now)
        elif isinstance(key, StuckCheck):
            self._check_stuck(key.mountpoint, now)
        elif isinstance(key, ProbeDue):
            self._probe(key.mountpoint, now)
        elif isinstance(key, DiscoverDue):
            self._discover(key.index, now)
        elif key == SPOOL_POLL:
            self._read_spool()
            self._timers.at(key, now + SPOOL_POLL_SECONDS)
        elif key == RECONCILE:
            self._timers.at(key, now + self.config.scan.reconcile_interval)
            for source in self._sources.values():
                for tier in source.tiers:
                    self._want_full_read(tier, now)
        elif key == NODE_REFRESH:
            self._refresh_node()
            self._timers.at(key, now + NODE_REFRESH_SECONDS)
        elif key == HEALTH_REFRESH:
            self._health = None
            self._republish = True

    def _changed(self, key: str, path: str) -> None:
        self._post(Changed(key, path))

    def _overflowed(self, path: str | None) -> None:
        self._post(Overflowed(path))

    def _lost(self, key: str, reason: str) -> None:
        self._post(Lost(key, reason))
