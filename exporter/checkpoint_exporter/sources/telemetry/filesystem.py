"""Capacity and health of the filesystems behind watched paths: one statvfs of each mount.

statvfs on a hung network mount blocks in the kernel until the server answers, perhaps never.
So it is no thread of its own: the daemon runs ``statvfs_of`` as a task on the mount's own
worker (daemon/health.py), the worker every read of that mount runs on, and one detector says a
mount hangs (a task that makes no progress for ``STUCK_SECONDS``), whatever hung in it: a scan
or the statvfs. Its device error, as node_exporter's node_filesystem_device_error, is that
worker being stuck or the latest statvfs failing, beside the last size and avail read and when
they were read (``capacity_of``).

The probe reads the mountpoint itself (from the exporter's own mount table, so a path in its own
namespace), not a watched path below it: a job's directory is deleted when the job is cleaned up,
and the filesystem it lived on is no less healthy for that. A mountpoint that is no longer there
(ENOENT: unmounted and removed) is not reported until it is back, rather than paged as a device
error.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    mountpoint: str  # statvfs of it reads the mount's filesystem
    device: str
    fstype: str


@dataclass(frozen=True)
class Reading:
    size_bytes: int
    avail_bytes: int  # available to non-root users, like node_exporter's avail
    checked_at: float  # wall-clock time of the statvfs that returned these


@dataclass(frozen=True)
class Statvfs:
    """What one statvfs answered: a reading, or why not."""

    reading: Reading | None = None
    failed: str | None = None  # the error, when it failed
    gone: bool = False  # no such path: the mountpoint was unmounted and removed


@dataclass(frozen=True)
class Capacity:
    mountpoint: str
    device: str
    fstype: str
    size_bytes: int
    avail_bytes: int
    checked_at: float  # when size and avail were read; 0.0 if never (both 0, device_error set)
    device_error: bool  # its worker is stuck, or the latest statvfs failed


@dataclass
class ProbeState:
    """One mount's latest statvfs answers. ``target`` is None for a mount the mount table did
    not name: its path is still probed (its worker's health), its capacity never reported."""

    target: Target | None
    path: str  # what is statvfs'd: the mountpoint, or a watched path when the mount is unknown
    reading: Reading | None = None
    failed: str | None = None  # why the latest returned probe failed; None when it read
    gone: bool = False  # the latest returned probe found no mountpoint: not reported

    def answered(self, answer: Statvfs) -> None:
        self.failed, self.gone = answer.failed, answer.gone
        if answer.reading is not None:
            self.reading = answer.reading


def read_capacity(path: str, clock: Callable[[], float]) -> Reading:
    stats = os.statvfs(path)
    return Reading(stats.f_blocks * stats.f_frsize, stats.f_bavail * stats.f_frsize, clock())


def statvfs_of(path: str, clock: Callable[[], float]) -> Statvfs:
    """One statvfs of ``path`` (on the mount's worker: it may block for good)."""
    try:
        return Statvfs(read_capacity(path, clock))
    except FileNotFoundError:
        return Statvfs(gone=True)
    except OSError as error:
        return Statvfs(failed=error.strerror or str(error))


def capacity_of(mount: ProbeState, stuck: bool) -> Capacity | None:
    """What a mount reports (a pure function of its probing state and whether its worker is
    stuck), or None: a mount the mount table did not name, one whose first statvfs is under way
    (not yet read, not in error), one whose mountpoint is gone (until back, or hung)."""
    target = mount.target
    if target is None:
        return None
    reading = mount.reading or Reading(0, 0, 0.0)
    device_error = stuck or mount.failed is not None
    if not device_error and (not reading.checked_at or mount.gone):
        return None
    return Capacity(
        target.mountpoint, target.device, target.fstype, reading.size_bytes,
        reading.avail_bytes, reading.checked_at, device_error,
    )  # fmt: skip


def capacities(mounts: Iterable[tuple[ProbeState, bool]]) -> list[Capacity]:
    """Each reported mount's capacity, by mountpoint, from (state, its worker is stuck)."""
    reported = (capacity_of(state, stuck) for state, stuck in mounts)
    return sorted((c for c in reported if c is not None), key=lambda c: c.mountpoint)
