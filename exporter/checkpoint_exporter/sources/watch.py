"""Decides *when* a job is rescanned: inotify on local filesystems, polling elsewhere.

inotify does not see writes made by other nodes of a network filesystem, so a job on nfs,
lustre, gpfs, wekafs, beegfs, ceph or any fuse filesystem is polled; the mount table
(``--path.procfs``/self/mountinfo) tells which is which, and ``watch: inotify|poll`` overrides it.
Watchers (inotify.Watcher) only mark jobs dirty; the scanner does the reading.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from checkpoint_exporter.sources.inotify import Watcher

__all__ = ["INOTIFY", "POLL", "Mount", "Watcher", "choose_mode", "mount_of", "read_mounts"]

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
    """The mount a path lives on, its symlinks resolved (which stats it)."""
    return mount_of_name(os.path.realpath(path), mounts)


def mount_of_name(path: str, mounts: list[Mount]) -> Mount | None:
    """The mount an absolute path lies on by its name: the longest mount point containing it
    (no system call, so nothing waits on a hung filesystem)."""
    best = None
    for mount in mounts:
        point = mount.mountpoint.rstrip("/") or "/"
        inside = path == point or path.startswith(point if point == "/" else point + "/")
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
