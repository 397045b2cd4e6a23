"""One call into the core: what the daemon hands a job's tracker (``JobTracker.apply``), and
everything the tracker asks of the daemon in return (``Effects``).

Every input carries ``now``, the wall clock the daemon read for it: the core never reads a clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from checkpoint_exporter.core.validation import ValidationRequest
from checkpoint_exporter.events import Event
from checkpoint_exporter.model import Found, Verdict, WatchedPath, WindowTelemetry


@dataclass(frozen=True)
class TierRead:
    """One read of a tier. ``unreadable``: the relative paths it could not read ("" for the
    root); ``layout``: the layout it detected (None when fixed or not known yet). What it shows
    committed was statted after its commit (daemon/reads.py ``_read_tier``)."""

    tier: str
    found: Sequence[Found]
    now: float
    unreadable: Sequence[str] = ()
    layout: str | None = None


@dataclass(frozen=True)
class SpoolEvents:
    """The job's new events from this node's spool."""

    events: Sequence[Event]
    now: float


@dataclass(frozen=True)
class VerdictIn:
    """A validation came back. ``verdict`` None: the generation moved while it was read (its
    tier is read again now); an ``unchecked`` verdict: its checks could not run, asked again at
    ``not_before``."""

    request: ValidationRequest
    verdict: Verdict | None
    now: float
    not_before: float = 0.0


@dataclass(frozen=True)
class Tick:
    """The job's timer fired (``Effects.next_due``)."""

    now: float


@dataclass(frozen=True)
class WindowTelemetryIn:
    """What this node's devices did during the save in ``Effects.correlate``;
    ``stall_network_bytes``: the network bytes over ``Effects.stall``."""

    telemetry: WindowTelemetry
    now: float
    stall_network_bytes: float | None = None


@dataclass(frozen=True)
class PathsPlaced:
    """How each tier is watched now (its mode, its filesystem), as the daemon placed it."""

    paths: tuple[WatchedPath, ...]
    now: float


Input = TierRead | SpoolEvents | VerdictIn | Tick | WindowTelemetryIn | PathsPlaced


@dataclass(frozen=True)
class Effects:
    """What the daemon does next for the job, after one ``apply``."""

    # Hand each to a validator: already marked submitted (not asked for again meanwhile).
    validations: tuple[ValidationRequest, ...] = ()
    rescan: tuple[str, ...] = ()  # tiers to read again now (a validation to ask again)
    # Per tier, the generations being written: their files are re-statted while hot.
    hot: tuple[tuple[str, tuple[str, ...]], ...] = ()
    saves_in_progress: bool = False  # the tiers are re-read on the hot interval
    next_due: float | None = None  # wall clock: apply a Tick then (None: nothing pending)
    # The newest finished save's window, while its telemetry is not in (correlate it once the
    # samples after its end are), and the part of it training was held (its network bytes).
    correlate: tuple[float, float] | None = None
    stall: tuple[float, float] | None = None
    changed: bool = False  # the published state moved: publish the job
    # The events the job's clocks refused so far, by reason (its caps and bounds): the daemon
    # adds them to the spool reader's own count (spool_dropped).
    events_dropped: tuple[tuple[str, int], ...] = ()
