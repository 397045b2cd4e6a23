"""Capacity of the filesystems behind watched paths: statvfs per mount, with a time budget.

statvfs on a hung network mount blocks in the kernel until the server answers, perhaps never.
Each probe runs on a daemon thread of its own, at most one in flight per mount: a mount whose
probe has not returned is not probed again until it does, so threads never pile up, and nothing
ever waits for a probe, so neither a scrape nor shutdown can hang on one (a daemon thread does
not keep the process from exiting; a ThreadPoolExecutor's workers do). A probe that overruns its
budget, or fails, reports the filesystem's device error, as node_exporter's
node_filesystem_device_error does, beside the last size and avail read and when they were read.

The probe reads the mountpoint itself (from the exporter's own mount table, so a path in its own
namespace), not a watched path below it: a job's directory is deleted when the job is cleaned up,
and the filesystem it lived on is no less healthy for that. A mountpoint that is no longer there
(ENOENT: unmounted and removed) is not reported until it is back, rather than paged as a device
error.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)


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
class Capacity:
    mountpoint: str
    device: str
    fstype: str
    size_bytes: int
    avail_bytes: int
    checked_at: float  # when size and avail were read; 0.0 if never (both 0, device_error set)
    device_error: bool  # the latest probe failed, or has overrun its budget


@dataclass
class ProbeState:
    """One mount's probing state; changed only under CapacityMonitor's lock."""

    target: Target
    reading: Reading | None = None
    failed: str | None = None  # why the latest returned probe failed; None when it read
    gone: bool = False  # the latest returned probe found no mountpoint: not reported
    in_flight_since: float | None = None  # monotonic start of the probe not yet returned
    overrun_logged: bool = False


def read_capacity(path: str) -> Reading:
    stats = os.statvfs(path)
    return Reading(stats.f_blocks * stats.f_frsize, stats.f_bavail * stats.f_frsize, time.time())


def capacity_of(mount: ProbeState, now: float, budget: float) -> Capacity:
    """What a mount reports at monotonic time ``now``: a pure function of its probing state."""
    overrun = mount.in_flight_since is not None and now - mount.in_flight_since > budget
    reading = mount.reading or Reading(0, 0, 0.0)
    target = mount.target
    return Capacity(
        target.mountpoint, target.device, target.fstype, reading.size_bytes,
        reading.avail_bytes, reading.checked_at, overrun or mount.failed is not None,
    )  # fmt: skip


class CapacityMonitor:
    """Probes each registered mount when asked; answers from the probes that returned."""

    def __init__(self, budget: float = 5.0, clock: Callable[[], float] = time.monotonic):
        self.budget = budget
        self.clock = clock
        self._lock = threading.Lock()
        self._mounts: dict[str, ProbeState] = {}  # mountpoint -> state
        self._closed = False

    def add(self, target: Target) -> None:
        """Probe a mount from now on, at once the first time it is added."""
        with self._lock:
            if target.mountpoint in self._mounts:
                return
            self._mounts[target.mountpoint] = ProbeState(target)
        self._start(target.mountpoint)

    def probe(self) -> None:
        """Start a probe of every mount that has none in flight; returns at once."""
        with self._lock:
            mountpoints = list(self._mounts)
        for mountpoint in mountpoints:
            self._start(mountpoint)

    def _start(self, mountpoint: str) -> None:
        with self._lock:
            mount = self._mounts[mountpoint]
            if self._closed:
                return
            if mount.in_flight_since is not None:
                waited = self.clock() - mount.in_flight_since
                if waited > self.budget and not mount.overrun_logged:
                    mount.overrun_logged = True
                    log.warning("statvfs of %s has not answered in %.0f s", mountpoint, waited)
                return  # never a second probe while one is blocked
            mount.in_flight_since = self.clock()
        threading.Thread(
            target=self._run, args=(mount,), name=f"statvfs {mountpoint}", daemon=True
        ).start()

    def _run(self, mount: ProbeState) -> None:
        failed = reading = None
        gone = False
        mountpoint = mount.target.mountpoint
        try:
            reading = read_capacity(mountpoint)
        except FileNotFoundError:
            gone = True
        except OSError as error:
            failed = error.strerror or str(error)
        with self._lock:
            waited = self.clock() - (mount.in_flight_since or 0.0)
            was_logged, mount.overrun_logged = mount.overrun_logged, False
            was_failed, mount.failed = mount.failed, failed
            was_gone, mount.gone = mount.gone, gone
            mount.in_flight_since = None
            if reading is not None:
                mount.reading = reading
        if gone != was_gone:
            log.info("mountpoint %s %s", mountpoint, "is gone" if gone else "is back")
        if failed is not None and failed != was_failed:
            log.warning("statvfs of %s failed: %s", mountpoint, failed)
        elif was_logged:
            log.info("statvfs of %s answered after %.0f s", mountpoint, waited)

    def capacities(self) -> list[Capacity]:
        """Each mount's capacity, by mountpoint: those read once, and those in error (a hung mount
        that never answered is reported too); a mount whose first probe is under way is not yet,
        nor one whose mountpoint is gone."""
        now = self.clock()
        with self._lock:
            states = [
                (capacity_of(state, now, self.budget), state.gone)
                for _, state in sorted(self._mounts.items())
            ]
        # A gone mountpoint is reported again once back, or once a probe of it hangs.
        return [c for c, gone in states if c.device_error or (c.checked_at and not gone)]

    def close(self) -> None:
        """Start no more probes. Returns at once: a probe still blocked is left to the kernel."""
        with self._lock:
            self._closed = True
