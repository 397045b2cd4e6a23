"""The vocabulary: plain, immutable dataclasses that flow from the tracker to the scrape."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

DURABLE = "durable"  # where committed generations must end up
STAGING = "staging"  # a fast tier that must drain to the durable one

# Generation states (DESIGN: writing -> committed -> valid | invalid, or writing -> aborted).
WRITING = "writing"
COMMITTED = "committed"
ABORTED = "aborted"
# Its commit marker went and its files are going (retention's rmtree may remove the marker
# first): neither a save in progress nor a restorable generation, and never an abort.
DELETING = "deleting"

# Save phases, in the order a save goes through them.
PHASES = ("pause", "staging", "write", "commit", "total")

# What a finished save suffered, from the seed article's bottleneck matrix (section 7): the
# label values of checkpoint_last_save_symptom_info and checkpoint_save_symptoms_total.
SYMPTOMS = (
    "staging_bound",  # the pause passed before network traffic rose: copying out of GPU memory
    "straggler",  # one node or rank finished writing much later than the others
    "contention",  # the save was slow while other jobs saved at the same time
    "commit_bound",  # the payload was written fast, the final commit was slow
    "backlog",  # async saves progressively slower, generations in flight piling up
    "unrestorable",  # committed, then a restore of it failed
    "training_disturbed",  # GPU utilisation in the window well below its baseline
)


@dataclass(frozen=True)
class WindowTelemetry:
    """What this node's devices did during one save (telemetry/correlate.py computes it)."""

    start: float
    end: float
    network_transmit_bytes: float | None = None
    network_peak_utilization: float | None = None
    disk_written_bytes: float | None = None
    gpu_utilization: float | None = None
    gpu_baseline_utilization: float | None = None


@dataclass(frozen=True)
class WatchedPath:
    tier: str
    path: str
    mode: str = ""  # how it is watched: inotify or poll ("" until decided)
    mountpoint: str = ""  # the filesystem it lives on
    # Read by this process: False for a tier outside its scopes (--scope, --shard), whose
    # generation-derived series other processes export.
    scanned: bool = True
    # As of its last read: the directory does not exist (yet, or any more), and how many
    # directories in it could not be read (permissions): 0 when all of it was.
    missing: bool = False
    unreadable: int = 0


@dataclass(frozen=True)
class Generation:
    """One checkpoint generation on one tier."""

    id: str  # path below the tier root
    tier: str
    step: int | None
    state: str
    start_time: float
    last_write_time: float
    commit_time: float | None
    bytes: int
    files: int
    valid: bool | None = None  # None until structurally checked
    invalid_reason: str | None = None


# What a layout finds in one listing, and what the validator says of it. The layouts
# (sources/layouts/) make them, the core reasons over them, the validator (sources/validate.py)
# judges them: plain values, holding nothing of the listing they came from.

# Check kinds: each names a path below the tier root.
DCP = "dcp"  # .metadata against the shards it names
ZIP = "zip"  # torch.save zip: end-of-central-directory record present
SAFETENSORS = "safetensors"  # header parses and its data fits in the file
SAFETENSORS_INDEX = "safetensors_index"  # every shard the index names exists
INTEGRITY = "integrity"  # Megatron integrity.json sha256, when the job opts in
# The zip check, and the ``global_step`` read inside the zip (returned as Verdict.step): for a
# file whose name has no step (Lightning's last.ckpt).
ZIP_STEP = "zip_step"


@dataclass(frozen=True)
class Check:
    """One structural check of a generation: ``kind`` on ``path`` (below the tier root). The
    validator reads the sizes it needs from the tier's latest listing, which the daemon holds."""

    kind: str
    path: str


@dataclass(frozen=True, eq=False)
class Found:
    """One generation as a layout sees it in one listing."""

    id: str  # path of the generation below the tier root
    step: int | None
    state: str  # writing | committed | aborted
    start_time: float  # earliest mtime seen (or the writer's own record)
    last_write_time: float
    commit_time: float | None
    bytes: int
    files: int
    checks: tuple[Check, ...] = ()
    reason: str | None = None  # why aborted, or why structurally invalid (e.g. bad_metadata)
    invalid: bool = False  # the layout itself found it structurally broken
    # No commit marker in the writer's protocol (a single-file checkpoint, DeepSpeed without
    # `latest`): the layout says WRITING, and the tracker judges the generation once it stayed
    # unchanged for the job's settle period: committed when its checks pass (or it has none),
    # aborted when they fail (a copy or a write cut short).
    settles: bool = False


# Why a generation is structurally invalid (checkpoint_last_committed_invalid_reason's values).
MISSING_SHARD = "missing_shard"
TRUNCATED_SHARD = "truncated_shard"  # shorter than its own metadata or header says
BAD_ZIP = "bad_zip"  # a torch.save zip without its end record: cut short or not a zip
BAD_METADATA = "bad_metadata"
CHECKSUM = "checksum"
REASONS = (MISSING_SHARD, TRUNCATED_SHARD, BAD_ZIP, BAD_METADATA, CHECKSUM)


@dataclass(frozen=True)
class Verdict:
    valid: bool
    reason: str | None = None  # one of REASONS when invalid
    detail: str = ""
    step: int | None = None  # a step read inside the generation, where its name has none
    # No verdict: the checks could not run for a reason that is not the checkpoint's (I/O
    # trouble, the metadata parser unavailable or over its memory). Asked again later.
    unchecked: bool = False


VALID = Verdict(True)


@dataclass(frozen=True)
class HistogramState:
    bounds: tuple[float, ...]  # upper bounds, ascending, without +Inf
    counts: tuple[int, ...]  # observations per bucket, len(bounds) + 1 (the last is +Inf)
    sum: float = 0.0

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[float, int]]:
        total, out = 0, []
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            total += count
            out.append((bound, total))
        return out


@dataclass(frozen=True)
class SaveRecord:
    """One finished save, for the landing page's timeline."""

    step: int | None
    start: float
    end: float
    phases: tuple[tuple[str, float], ...]  # empty for an aborted save
    outcome: str  # ok | late (over the deadline) | aborted
    symptoms: tuple[str, ...] = ()  # from SYMPTOMS: the diagnosis of this save
    # Another job's save overlapped it, as judged when it was diagnosed (the neighbours' own
    # records of that time are gone a dozen saves later).
    overlapped: bool = False


@dataclass(frozen=True)
class RestoreRecord:
    at: float
    ok: bool
    duration: float
    reason: str = ""
    drill: bool = False  # a restore drill, not a training job loading its checkpoint


@dataclass(frozen=True)
class JobState:
    """What the exporter knows about one training job at one instant."""

    name: str
    layout: str
    paths: tuple[WatchedPath, ...]
    interval_seconds: float
    deadline_seconds: float
    retained_generations_limit: int
    restore_drill_max_age_seconds: float
    mtbf_seconds: float | None = None  # the job's reliability objective (config ``mtbf``)
    abandon_after_seconds: float = 86400.0  # no sign of life this long: presumed gone
    paging: bool = True  # its failures page (critical); else they open tickets (warning)
    # Liveness, wall clock: when this process began watching the job, the job's last sign of
    # life (None: none seen), and whether it finished (said so, or the config says so).
    first_seen: float = 0.0
    alive_at: float | None = None
    finished: bool = False
    # When it said it finished (+inf: the config says so), and its newest heartbeat.
    finished_at: float | None = None
    heartbeat_at: float | None = None
    generations: tuple[Generation, ...] = ()
    saves_committed: int = 0
    saves_aborted: int = 0
    deadline_misses: int = 0
    saves_within_deadline: int = 0  # committed saves whose total was within the deadline
    validation_failures: tuple[tuple[str, int], ...] = ()
    save_duration: tuple[tuple[str, HistogramState], ...] = ()  # (phase, histogram)
    last_phases: tuple[tuple[str, float], ...] = ()  # the newest finished save's phases
    last_save_symptoms: tuple[str, ...] = ()  # the newest finished save's diagnosis (SYMPTOMS)
    save_symptoms: tuple[tuple[str, int], ...] = ()  # (symptom, saves diagnosed with it)
    # This process read save events of the job from its spool (its ranks save on this node): a
    # node-scope process then exports every symptom counter from 0, not only those it counted.
    saves_timed: bool = False
    # Saves this node's ranks started and have not all ended (the spool): a save whose ranks
    # died stays here until its timeline expires.
    local_saves_in_progress: int = 0
    last_write_end: float | None = None  # its last local write (this node's ranks)
    last_write_step: int | None = None  # the step of that save, when its events give one
    last_write_spread: float | None = None  # its spread of write ends across local ranks
    restores: int = 0  # every restore, drills included
    restore_failures: int = 0
    restore_drills: int = 0  # of those, the restore drills
    restore_drill_failures: int = 0
    restore_last_success: float | None = None
    restore_last_duration: float | None = None
    window: WindowTelemetry | None = None  # what this node did during the newest save
    drain_backlog_bytes: int = 0
    drain_backlog_generations: int = 0
    oldest_undrained_commit: float = 0.0
    staged_bytes: int = 0
    drained_bytes: int = 0
    lost_generations: int = 0
    recent_saves: tuple[SaveRecord, ...] = ()  # oldest first
    recent_restores: tuple[RestoreRecord, ...] = ()
    storage_clock_skew: float | None = None  # file mtimes minus this node's clock, seconds
    # checkpoint_last_committed_valid: the newest committed generation's verdict, or while that
    # one is being validated, the verdict it had before (None: nothing judged yet).
    last_committed_valid: bool | None = None
    # Raised by the core whenever anything above changes: the exposition re-renders a job only
    # when its version moved.
    version: int = 0
    # Derived once, when the state is built, from the fields above (never passed in, so a
    # ``replace`` recomputes them): the exposition reads these rather than working them out.
    # The generation a restore would pick: the newest committed one on the durable tier.
    newest_committed: Generation | None = field(init=False, default=None)
    # The newest save's phases: its ranks' (or the disk's, as the core accounted it), else,
    # when no save ended while this process ran, the newest committed generation's disk total.
    last_save_phases: tuple[tuple[str, float], ...] = field(init=False, default=())

    def __post_init__(self) -> None:
        committed = [g for g in self.generations if g.tier == DURABLE and g.state == COMMITTED]
        newest = max(committed, key=restore_preference, default=None)
        phases = self.last_phases
        if not phases and newest is not None and newest.commit_time is not None:
            phases = (("total", disk_total(newest.start_time, newest.commit_time)),)
        object.__setattr__(self, "newest_committed", newest)  # frozen: set once, here
        object.__setattr__(self, "last_save_phases", phases)


def disk_total(start: float, commit: float) -> float:
    """A save's total as the disk tells it: first write to commit, both mtimes on one clock."""
    return max(0.0, commit - start)


def newest_committed(job: JobState) -> Generation | None:
    """The generation a restore would pick (``JobState.newest_committed``)."""
    return job.newest_committed


def scanned(job: JobState, tier: str) -> bool:
    """Whether this process reads the job's ``tier`` (it has one, inside the process's scopes)."""
    return any(path.tier == tier and path.scanned for path in job.paths)


def reads_a_tree(job: JobState) -> bool:
    """Whether this process reads any of the job's tiers. A node-scope process knows a job whose
    trees are all shared from its spool alone: it exports that job's per-node clocks, and leaves
    the per-job series (objectives, the deadline accounting) to the processes that read them."""
    return any(path.scanned for path in job.paths)


class _Committed(Protocol):
    commit_time: float | None
    step: int | None


def restore_preference(generation: _Committed) -> tuple[float, int]:
    """The order a restore picks committed generations in, best last: the newest commit, then
    the highest step. The gauges (``newest_committed``) and the restore drill both use it, so
    the generation reported restorable is the one the drill restores. By commit time rather
    than step: a job rolled back after a loss spike (the higher step left on disk), or whose
    step counter starts again, saves fine and must not look hours old; a file dated ahead of
    the clock cannot win, since published times are never later than when they were seen."""
    return (generation.commit_time or 0.0, -1 if generation.step is None else generation.step)


@dataclass(frozen=True)
class DaemonState:
    """The exporter's own health."""

    scans: HistogramState | None = None
    metadata_operations: int = 0
    watch_overflows: int = 0
    scan_errors: int = 0
    spool_events: tuple[tuple[str, int], ...] = ()  # (event, count)
    spool_invalid: tuple[tuple[str, int], ...] = ()  # (reason, count)
    spool_dropped: tuple[tuple[str, int], ...] = ()  # (reason, events)
    spool_dropped_bytes: tuple[tuple[str, int], ...] = ()  # (reason, bytes)
    spool_squatted: tuple[tuple[str, int], ...] = ()  # (job, directories refused for their owner)
    spool_backlog_bytes: int = 0
    spool_poll_seconds: float = 0.0  # time spent reading the spool, all polls together
    discover_excess: tuple[tuple[str, int], ...] = ()  # (root, subdirectories over max_jobs)
    discover_missing: tuple[tuple[str, int], ...] = ()  # (root, 1 while it does not exist)
    # The spool exists and any user's training job can make its directory there; None where
    # this process reads no spool (shared scope).
    spool_writable: bool | None = None
    # Readiness: every watched tier has had its first full pass (the port opens before that).
    ready: bool = False
    first_scans: tuple[tuple[str, str, bool, int], ...] = ()  # (job, tier, done, entries read)
    mounts: tuple[tuple[str, bool], ...] = ()  # (mountpoint, stuck: a pass over its time budget)
    # (job, tier, wall time): when this tier's view was last confirmed current (a pass, or for a
    # watched tier, a probe of its mount) -- the age of what the job's series say.
    scan_success: tuple[tuple[str, str, float], ...] = ()
    config_reload_successful: bool = True
    config_reload_success_time: float = 0.0
    # (shard, shards, scopes) when the process was told to serve part of the fleet; None for the
    # default (both scopes, one shard).
    shard_info: tuple[int, int, str] | None = None
    # (mountpoint, tasks of its worker that raised instead of handing back a value: a bug)
    worker_task_failures: tuple[tuple[str, int], ...] = ()
    # (job, its object-store usage) for each job with a tier in object storage
    object_stores: tuple[tuple[str, ObjectStoreUsage], ...] = ()


@dataclass(frozen=True)
class ObjectStoreUsage:
    """One job's object-store requests and open uploads, as of its tiers' last reads."""

    requests: tuple[tuple[str, int], ...] = ()  # (operation, count)
    errors: tuple[tuple[str, str, int], ...] = ()  # (operation, code, count)
    incomplete_uploads: int = 0
    incomplete_upload_bytes: int | None = None  # None: the store did not tell
    oldest_incomplete_upload: float | None = None  # wall time a listing first saw it


@dataclass(frozen=True)
class FilesystemState:
    mountpoint: str
    device: str
    fstype: str
    size_bytes: int
    avail_bytes: int
    reserve_ratio: float  # the largest capacity_reserve among the jobs on it
    # statvfs did not answer within its time budget (a hung mount) or failed: size and avail are
    # the last values read, as of checked_at.
    device_error: bool = False
    checked_at: float = 0.0


@dataclass(frozen=True)
class Snapshot:
    """Everything a scrape renders. Built off the scrape path; read without locks or I/O."""

    jobs: tuple[JobState, ...] = ()
    daemon: DaemonState = field(default_factory=DaemonState)
    filesystems: tuple[FilesystemState, ...] = ()
    telemetry: tuple[tuple[str, bool], ...] = ()  # (source, has data)
