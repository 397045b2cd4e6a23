"""Network interfaces: byte counters (psutil, from procfs) and link speed (sysfs, Mbit/s).

A bond and its slaves both match the usual device pattern; only the bond is counted, or its
traffic would be counted twice. IPoIB interfaces are skipped while InfiniBand ports are sampled:
the port counters already include their traffic.
"""

from __future__ import annotations

import re
from pathlib import Path

import psutil

from checkpoint_exporter.errors import NoDataError
from checkpoint_exporter.telemetry.base import Sample, read_int, read_text

ARPHRD_INFINIBAND = 32


class NetSource:
    name = "network"

    def __init__(self, procfs: Path, sysfs: Path, pattern: str, skip_ipoib: bool):
        self.procfs, self.sysfs = procfs, sysfs
        self.pattern = re.compile(pattern)
        self.skip_ipoib = skip_ipoib

    def devices(self, names: list[str]) -> list[str]:
        """The interfaces to count among ``names``."""
        chosen = [n for n in names if self.pattern.search(n)]
        out = []
        for name in chosen:
            master = self.sysfs / "class" / "net" / name / "master"
            if master.is_symlink() and Path(master.resolve()).name in chosen:
                continue  # a bond slave: its bond is counted
            kind = read_int(self.sysfs / "class" / "net" / name / "type")
            if self.skip_ipoib and kind == ARPHRD_INFINIBAND:
                continue
            out.append(name)
        return out

    def speed_bits(self, device: str) -> float | None:
        """Link speed in bits per second; None when unknown (sysfs says -1, or nothing)."""
        speed = read_text(self.sysfs / "class" / "net" / device / "speed")
        try:
            mbits = int(speed) if speed is not None else -1
        except ValueError:
            return None
        return mbits * 1e6 if mbits > 0 else None

    def sample(self) -> Sample:
        psutil.PROCFS_PATH = str(self.procfs)
        try:
            counters = psutil.net_io_counters(pernic=True, nowrap=False)
        except (OSError, RuntimeError) as error:
            raise NoDataError(f"cannot read network counters: {error}") from None
        out: Sample = {}
        for name in self.devices(sorted(counters)):
            out[(name, "tx_bytes")] = float(counters[name].bytes_sent)
            out[(name, "rx_bytes")] = float(counters[name].bytes_recv)
        if not out:
            raise NoDataError(f"no interface matches {self.pattern.pattern!r}")
        return out
