"""What reaches the core thread: the values its workers hand back (a tier placed, a tier read, a
discover root listed, a mount probed; a task that raised is a ``workers.TaskFailed``), and what
the watcher and a reload post. Frozen: once handed over, nobody changes them. The timer keys are
in ``timers``."""

from __future__ import annotations

from dataclasses import dataclass

from checkpoint_exporter.config import Config
from checkpoint_exporter.daemon.state import Discovery, Tier
from checkpoint_exporter.sources import layouts
from checkpoint_exporter.sources.listing import TreeReader
from checkpoint_exporter.sources.objects import ObjectTreeReader
from checkpoint_exporter.sources.telemetry.filesystem import Statvfs
from checkpoint_exporter.sources.watch import Mount

# --- values the workers hand back -------------------------------------------------------------


@dataclass(frozen=True)
class Placed:
    tier: Tier
    mount: Mount | None
    mode: str
    reason: str
    reader: TreeReader | ObjectTreeReader | None  # None: outside this process's scopes, never read
    scope: str


@dataclass(frozen=True)
class PlaceFailed:
    """Placing the tier raised on its worker (a bug): placed again after a pause."""

    tier: Tier


@dataclass(frozen=True)
class Read:
    tier: Tier
    found: list[layouts.Found]
    unreadable: frozenset[str]
    errors: int
    layout: str | None  # detected, when not fixed by the config
    seconds: float
    reconcile: int  # the full-read request it satisfies (0: not a full read)
    error: Exception | None = None
    missing: bool = False  # no directory at the tier's path


@dataclass(frozen=True)
class Candidate:
    """A subdirectory of a discover root."""

    name: str
    mtime: float  # the directory's own: it moves when a generation is added or removed
    empty: bool  # nothing in it: no job yet (a mkdir costs nothing; it takes no max_jobs slot)


@dataclass(frozen=True)
class Listed:
    discovery: Discovery
    found: list[Candidate] | None  # None: could not be listed
    missing: bool = False  # the root does not exist


@dataclass(frozen=True)
class Probed:
    """A statvfs of the mount, run on its worker."""

    worker: str
    at: float  # wall time the filesystem answered
    answer: Statvfs


# --- what other threads put in the core's inbox -------------------------------------------------


@dataclass(frozen=True)
class Changed:
    """The watcher saw ``path`` change below a tier of ``job``."""

    job: str
    path: str


@dataclass(frozen=True)
class Overflowed:
    """The inotify queue overflowed (below ``path``; None: anywhere)."""

    path: str | None


@dataclass(frozen=True)
class Lost:
    """The job's tree grew past the inotify limits: it is polled from now on."""

    job: str
    reason: str


@dataclass(frozen=True)
class Reload:
    config: Config


@dataclass(frozen=True)
class ReloadFailed:
    """The configuration file could not be loaded again: the running one stays."""
