"""A fixture node: sysfs and procfs trees laid out as the kernel lays them out, whose counters
advance at chosen rates, as node_exporter's tests fake the hardware this machine lacks.

Two Ethernet NICs, one enslaved to a bond (the bond is what counts), an IPoIB interface (its
traffic is in the IB port counters), two InfiniBand ports, and a device-mapper volume over two
disk partitions, mounted at a real directory so statvfs answers for it.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

NET_DEV_HEADER = (
    "Inter-|   Receive                                                |  Transmit\n"
    " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs "
    "drop fifo colls carrier compressed\n"
)


def _write(path: Path, text: str) -> None:
    """Replace a file atomically, so a reader never sees half a counter."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


@dataclass
class FakeNode:
    root: Path
    mountpoint: Path  # a real directory the fixture mount table places on the dm volume
    rates: dict[str, float] = field(default_factory=dict)  # counter -> bytes per second
    counters: dict[str, float] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    @property
    def procfs(self) -> Path:
        return self.root / "proc"

    @property
    def sysfs(self) -> Path:
        return self.root / "sys"

    def build(self) -> FakeNode:
        sys_ = self.sysfs
        for name, speed, kind in (("eth0", 25000, 1), ("eth1", 100000, 1), ("bond0", 200000, 1),
                                  ("ib0", 200000, 32), ("lo", -1, 772)):  # fmt: skip
            _write(sys_ / "class/net" / name / "speed", f"{speed}\n")
            _write(sys_ / "class/net" / name / "type", f"{kind}\n")
        (sys_ / "class/net/eth1/master").symlink_to("../bond0")
        for port, rate in (("mlx5_0/ports/1", "200 Gb/sec (4X HDR)"),
                           ("mlx5_1/ports/1", "400 Gb/sec (4X NDR)")):  # fmt: skip
            _write(sys_ / "class/infiniband" / port / "rate", rate + "\n")
        # /sys/dev/block/253:0 -> the dm volume, whose slaves are partitions of sda and sdb.
        devices = sys_ / "devices"
        for disk, part in (("sda", "sda2"), ("sdb", "sdb2")):
            _write(devices / "pci0000:00" / disk / part / "partition", "2\n")
        dm = devices / "virtual/block/dm-0"
        _write(dm / "dm/name", "vg-ckpt\n")
        (dm / "slaves").mkdir(parents=True)
        (dm / "slaves/sda2").symlink_to("../../../../pci0000:00/sda/sda2")
        (dm / "slaves/sdb2").symlink_to("../../../../pci0000:00/sdb/sdb2")
        (sys_ / "dev/block").mkdir(parents=True)
        (sys_ / "dev/block/253:0").symlink_to("../../devices/virtual/block/dm-0")
        _write(
            self.procfs / "self/mountinfo",
            "22 1 259:1 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p1 rw\n"
            f"98 22 253:0 / {self.mountpoint} rw,relatime shared:2 - xfs /dev/mapper/vg-ckpt rw\n",
        )
        for name in ("eth0", "eth1", "bond0", "ib0", "lo", "mlx5_0", "mlx5_1", "dm-0", "sda2"):
            self.counters.setdefault(name, 1_000_000.0)
        self.flush()
        return self

    def flush(self) -> None:
        c = self.counters
        lines = [
            f"{name:>6}: {int(c[name] / 2)} 10 0 0 0 0 0 0 {int(c[name])} 20 0 0 0 0 0 0"
            for name in ("eth0", "eth1", "bond0", "ib0", "lo")
        ]
        _write(self.procfs / "net/dev", NET_DEV_HEADER + "\n".join(lines) + "\n")
        for device in ("mlx5_0", "mlx5_1"):
            counters = self.sysfs / "class/infiniband" / device / "ports/1/counters"
            _write(counters / "port_xmit_data", f"{int(c[device] / 4)}\n")  # 4-octet units
            _write(counters / "port_rcv_data", f"{int(c[device] / 8)}\n")
        stats = [
            f" 253       0 dm-0 100 0 800 10 50 0 {int(c['dm-0'] / 512)} 20 0 30 40 0 0 0 0",
            f"   8       2 sda2 100 0 800 10 50 0 {int(c['sda2'] / 512)} 20 0 30 40 0 0 0 0",
        ]
        _write(self.procfs / "diskstats", "\n".join(stats) + "\n")

    def advance(self, seconds: float) -> None:
        for name, rate in self.rates.items():
            self.counters[name] += rate * seconds
        self.flush()

    def run(self, step: float = 0.05) -> None:
        """Advance the counters in real time, in a thread, until ``stop``."""

        def loop() -> None:
            last = time.monotonic()
            while not self._stop.wait(step):
                now = time.monotonic()
                self.advance(now - last)
                last = now

        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
