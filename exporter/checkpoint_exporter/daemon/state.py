"""The core thread's own vocabulary: a job's watched tiers, the jobs, the discover roots, and
the budgets more than one part of the core keeps."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from checkpoint_exporter.config import DiscoverConfig, JobConfig, Policy
from checkpoint_exporter.daemon.timers import ScanDue
from checkpoint_exporter.model import DURABLE
from checkpoint_exporter.sources import layouts
from checkpoint_exporter.sources.listing import TreeReader
from checkpoint_exporter.sources.object_store import RequestCounter
from checkpoint_exporter.sources.objects import ObjectTreeReader
from checkpoint_exporter.sources.telemetry.filesystem import ProbeState

# A filesystem task (a read, a stat) that completes no metadata operation for this long marks
# its mount stuck. A healthy NFS, Lustre or GPFS operation takes milliseconds and its bad tail a
# few seconds (a lock recall, a server failover is 10-20 s); a soft NFS mount itself gives up only
# after minutes (timeo=60 s, retrans). 30 s of nothing is no slow disk, it is well inside the
# minutes the staleness alerts work in, and a cold pass that crawls under the metadata-ops budget
# still moves (its progress is what is timed, not its length).
STUCK_SECONDS = 30.0
# Each mount behind a watched tier is statvfs'd this often, on its worker: its capacity, its
# health, and for an inotify-watched tier (not read while nothing changes) the confirmation that
# its view is current (the filesystem answers, so events would come).
PROBE_SECONDS = 30.0


@dataclass(eq=False)
class Tier:
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
    reader: TreeReader | ObjectTreeReader | None = None  # made on its worker: the root may hang
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
    place_failed: bool = False  # its placement raised: placed again at retry_at
    unreadable: int = 0  # directories its last read could not read
    # An object URL's connection (config.JobConfig.storage_options); () for a directory.
    storage_options: tuple[tuple[str, object], ...] = ()
    # An object tier's requests, counted across its readers: placed again (a reload that changed
    # the job, a failed placement) it keeps counting where it was, as a Prometheus counter must.
    requests: RequestCounter | None = None

    @cached_property
    def key(self) -> ScanDue:
        # One key per tier, not one per read: each read sets its timer.
        return ScanDue(self.job, self.tier)


@dataclass(eq=False)
class Source:
    """Scanning state of one job."""

    name: str
    policy: Policy
    tiers: list[Tier]
    fixed_layout: str | None
    discovered_from: str | None = None
    missing_since: float | None = None
    config: JobConfig | None = None  # what the config file said (None: discovered)


@dataclass
class Discovery:
    entry: DiscoverConfig
    listing: bool = False  # a listing is on its worker
    listed: bool = False  # listed once: its jobs count towards readiness
    excess: int = 0
    reported: set[str] = field(default_factory=set)
    missing: bool = False  # the root does not exist (yet)
    # Jobs that gave their slot to a newer one, by their directory's mtime then: watched again
    # only once written since, so two idle jobs never take turns.
    displaced: dict[str, float] = field(default_factory=dict)
    # An object-store root (worker side): its store's reader, made on the first listing, and
    # when each prefix under it was first listed (a prefix has no mtime: this dates a run).
    store: ObjectTreeReader | None = None
    first_listed: dict[str, float] = field(default_factory=dict)
    # Displaced runs last looked into: when, and the generations then.
    looked_into: dict[str, tuple[float, frozenset[str]]] = field(default_factory=dict)


def configured_scope(tier: str, policy: Policy) -> str:
    """A tier's scope as the config sets it ("" for auto: its mount decides). ``scope`` names
    the durable tier's; a staging tier is always scoped from its mount."""
    return policy.scope if tier == DURABLE and policy.scope != "auto" else ""


def contains(parent: str, child: str) -> bool:
    parent = parent.rstrip("/")
    return child == parent or child.startswith(parent + "/")


@dataclass(eq=False)
class Probe:
    """A mount the core probes (daemon/health.py): its latest statvfs answers, and the probe's
    own bookkeeping."""

    state: ProbeState
    in_flight: bool = False  # a probe is queued or running on the mount's worker: not another
    inotify: bool = False  # it may hold inotify-watched tiers, which an answer confirms
