"""Decides *when* a job is rescanned: inotify (watchdog) on local filesystems, polling elsewhere.

inotify does not see writes made by other nodes of a network filesystem, so a job on nfs,
lustre, gpfs, wekafs, beegfs, ceph or any fuse filesystem is polled; the mount table
(``--path.procfs``/self/mountinfo) tells which is which, and ``watch: inotify|poll`` overrides it.
Watchers only mark jobs dirty; the scanner does the reading.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

INOTIFY = "inotify"
POLL = "poll"

NETWORK_FILESYSTEMS = frozenset(
    {"nfs", "nfs4", "lustre", "gpfs", "wekafs", "beegfs", "ceph", "cifs", "smb3", "smbfs",
     "glusterfs", "afs", "9p", "ocfs2", "gfs2", "pvfs2", "orangefs", "panfs", "davfs"}
)  # fmt: skip


@dataclass(frozen=True)
class Mount:
    mountpoint: str
    device: str
    fstype: str
    major_minor: str  # "259:1", joins block-device telemetry


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as octal (\040 ...).
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 3 < len(field) and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def parse_mountinfo(text: str) -> list[Mount]:
    mounts = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, rest = left.split(), right.split()
        if not sep or len(fields) < 5 or len(rest) < 2:
            continue
        mounts.append(Mount(_unescape(fields[4]), _unescape(rest[1]), rest[0], fields[2]))
    return mounts


def read_mounts(procfs: Path) -> list[Mount]:
    for candidate in (procfs / "self" / "mountinfo", procfs / "1" / "mountinfo"):
        try:
            return parse_mountinfo(candidate.read_text(encoding="utf-8", errors="replace"))
        except OSError:
            continue
    return []


def mount_of(path: str, mounts: list[Mount]) -> Mount | None:
    """The mount a path lives on: the longest mount point that contains it."""
    real = os.path.realpath(path)
    best = None
    for mount in mounts:
        point = mount.mountpoint.rstrip("/") or "/"
        inside = real == point or real.startswith(point if point == "/" else point + "/")
        if inside and (best is None or len(point) >= len(best.mountpoint.rstrip("/") or "/")):
            best = mount
    return best


def is_network(fstype: str) -> bool:
    return fstype in NETWORK_FILESYSTEMS or fstype.startswith("fuse")


def choose_mode(preference: str, mount: Mount | None) -> tuple[str, str]:
    """(mode, why) for a path: the configured preference, else what its filesystem allows."""
    if preference in (INOTIFY, POLL):
        return preference, "configured"
    if mount is None:
        return INOTIFY, "mount unknown"
    if is_network(mount.fstype):
        return POLL, f"network filesystem {mount.fstype}"
    return INOTIFY, f"local filesystem {mount.fstype}"


# watchdog's inotify reader logs each queue overflow once, here, then repairs its own watches.
_OVERFLOW_LOGGER = "watchdog.observers.inotify_c"


class _OverflowHook(logging.Handler):
    """watchdog recovers from an inotify queue overflow by itself but only says so in its log;
    this turns that record into a callback, so the overflow is counted and reconciled (the
    events lost could have been anyone's, so every job is reconciled)."""

    def __init__(self, callback: Callable[[str | None], None]):
        super().__init__(logging.DEBUG)
        self.callback = callback

    def emit(self, record: logging.LogRecord) -> None:
        if "overflow" in str(record.msg).lower():
            self.callback(None)


class Watcher:
    """inotify watches (through watchdog) that report changes per key (a job or a root)."""

    def __init__(
        self,
        on_change: Callable[[str, str], None],
        on_overflow: Callable[[str | None], None],
    ) -> None:
        from watchdog.observers import Observer

        self._observer = Observer()
        self._on_change = on_change
        self._watches: dict[str, list[object]] = {}
        self._lock = threading.Lock()
        self._hook = _OverflowHook(on_overflow)
        overflow_logger = logging.getLogger(_OVERFLOW_LOGGER)
        overflow_logger.addHandler(self._hook)
        # Counted whatever --log.level says; the stderr handler still filters what is printed.
        overflow_logger.setLevel(min(overflow_logger.getEffectiveLevel(), logging.WARNING))

    def start(self) -> None:
        self._observer.start()

    def stop(self) -> None:
        logging.getLogger(_OVERFLOW_LOGGER).removeHandler(self._hook)
        self._observer.stop()
        self._observer.join(timeout=5)

    def watch(self, key: str, path: str, recursive: bool = True) -> str | None:
        """Watch ``path`` for ``key``; None on success, else why it cannot."""
        from watchdog.events import FileSystemEvent, FileSystemEventHandler

        on_change = self._on_change
        root = path

        class Handler(FileSystemEventHandler):
            def on_any_event(self, event: FileSystemEvent) -> None:
                # Our own reads (validation) show up as opens and read-only closes: not changes.
                if event.event_type in ("opened", "closed_no_write"):
                    return
                source = event.src_path
                on_change(key, os.fsdecode(source) if isinstance(source, bytes) else source)

        try:
            watch = self._observer.schedule(Handler(), root, recursive=recursive)
        except OSError as error:
            if error.errno in (errno.ENOSPC, errno.EMFILE):
                return f"inotify limit reached ({error.strerror})"
            return f"cannot watch: {error.strerror or error}"
        with self._lock:
            self._watches.setdefault(key, []).append(watch)
        return None

    def unwatch(self, key: str) -> None:
        with self._lock:
            watches = self._watches.pop(key, [])
        for watch in watches:
            with contextlib.suppress(KeyError, OSError):
                self._observer.unschedule(watch)
