"""Capacity of the filesystems behind watched paths: statvfs, on a thread of its own.

statvfs on a hung network mount blocks forever; a probe that has not answered within the timeout
is left running, its filesystem reported stale, and not asked again until it returns.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import time
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Capacity:
    mountpoint: str
    device: str
    fstype: str
    size_bytes: int
    avail_bytes: int  # available to non-root users, like node_exporter's avail
    checked_at: float


def statvfs_capacity(path: str, mountpoint: str, device: str, fstype: str) -> Capacity:
    stats = os.statvfs(path)
    return Capacity(
        mountpoint, device, fstype, stats.f_blocks * stats.f_frsize,
        stats.f_bavail * stats.f_frsize, time.time(),
    )  # fmt: skip


class CapacityMonitor:
    """Probes each (path, mount) at most once per interval; answers from the last probe."""

    def __init__(self, timeout: float = 5.0):
        self.timeout = timeout
        self._pool = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="statvfs")
        self._running: dict[str, concurrent.futures.Future[Capacity]] = {}
        self.latest: dict[str, Capacity] = {}  # mountpoint -> capacity
        self._stuck_logged: set[str] = set()

    def probe(self, targets: dict[str, tuple[str, str, str]]) -> None:
        """``targets``: mountpoint -> (a path on it, device, fstype)."""
        started = {}
        for mountpoint, (path, device, fstype) in targets.items():
            previous = self._running.get(mountpoint)
            if previous is not None and not previous.done():
                continue  # still stuck from last time
            started[mountpoint] = self._running[mountpoint] = self._pool.submit(
                statvfs_capacity, path, mountpoint, device, fstype
            )
        if not started:
            return
        done, _ = concurrent.futures.wait(started.values(), timeout=self.timeout)
        for mountpoint, future in started.items():
            if future not in done:
                if mountpoint not in self._stuck_logged:
                    self._stuck_logged.add(mountpoint)
                    log.warning("statvfs of %s did not answer in %.0f s", mountpoint, self.timeout)
                continue
            try:
                self.latest[mountpoint] = future.result()
                self._stuck_logged.discard(mountpoint)
            except OSError as error:
                log.warning("statvfs of %s failed: %s", mountpoint, error.strerror or error)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
