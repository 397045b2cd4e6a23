"""Block devices behind watched paths, and the bytes written to them (procfs diskstats).

A path's filesystem is found in the mount table; its major:minor leads through
``/sys/dev/block`` to the device. A partition belongs to its disk; device-mapper and md devices
name the disks below them (``slaves/``). Writes are read from the device the filesystem sits on,
which counts what the filesystem wrote once, whatever RAID or LVM does below.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

from checkpoint_exporter.errors import NoDataError
from checkpoint_exporter.sources.telemetry.base import Sample, read_text

SECTOR = 512  # diskstats counts 512-byte sectors whatever the device's own sector size


@dataclass(frozen=True)
class BlockDevice:
    name: str  # as diskstats names it: sda1, nvme0n1, dm-0, md0
    kind: str  # disk | partition | dm | md
    disks: tuple[str, ...]  # the whole disks it lives on


def resolve(sysfs: Path, major_minor: str) -> BlockDevice | None:
    """The block device for a mount's major:minor; None for a filesystem without one (nfs)."""
    if major_minor.startswith("0:"):
        return None  # anonymous device numbers: network, fuse, tmpfs ...
    link = sysfs / "dev" / "block" / major_minor
    try:
        device = link.resolve(strict=True)
    except OSError:
        return None
    name = device.name
    if (device / "partition").exists():
        return BlockDevice(name, "partition", (device.parent.name,))
    kind = "dm" if (device / "dm").is_dir() else "md" if (device / "md").is_dir() else "disk"
    if kind == "disk":
        return BlockDevice(name, kind, (name,))
    return BlockDevice(name, kind, tuple(_disks_below(device)))


def _disks_below(device: Path, depth: int = 0) -> list[str]:
    slaves = device / "slaves"
    try:
        below = sorted(slaves.iterdir())
    except OSError:
        return [device.name]
    if not below or depth > 8:
        return [device.name]
    disks: list[str] = []
    for slave in below:
        target = slave.resolve()
        if (target / "partition").exists():
            disks.append(target.parent.name)
        else:
            disks.extend(_disks_below(target, depth + 1))
    return sorted(set(disks))


def parse_diskstats(text: str) -> dict[str, int]:
    """Device name -> bytes written (field 10, sectors written, x 512)."""
    out = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 10 and fields[9].isdigit():
            out[fields[2]] = int(fields[9]) * SECTOR
    return out


class DiskSource:
    name = "disk"

    def __init__(self, procfs: Path):
        self.procfs = procfs
        # Copy-on-write: the scanner adds devices while the sampler thread iterates them, so the
        # set is never changed, only replaced (under the lock, so no addition is lost), and
        # sample() reads the reference once.
        self.devices: frozenset[str] = frozenset()
        self._adding = threading.Lock()

    def add(self, device: str) -> None:
        """Sample a block device from the next sample on (whoever knows the watched paths)."""
        with self._adding:
            if device not in self.devices:
                self.devices = self.devices | {device}

    def sample(self) -> Sample:
        devices = self.devices
        if not devices:
            raise NoDataError("no watched path is on a block device")
        text = read_text(self.procfs / "diskstats")
        if text is None:
            raise NoDataError("cannot read diskstats")
        written = parse_diskstats(text)
        out = {(name, "written_bytes"): float(written[name]) for name in devices if name in written}
        if not out:
            raise NoDataError("the backing devices are not in diskstats")
        return out
