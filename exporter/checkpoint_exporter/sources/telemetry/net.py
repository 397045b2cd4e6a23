"""Network interfaces: byte counters (procfs net/dev) and link speed (sysfs, Mbit/s).

net/dev is read below ``--path.procfs`` directly, as node_exporter's netdev collector reads it;
psutil would need its process-wide PROCFS_PATH set to be pointed there.

A bond and its slaves both match the usual device pattern; only the bond is counted, or its
traffic would be counted twice. IPoIB interfaces are skipped while InfiniBand ports are sampled:
the port counters already include their traffic.
"""

from __future__ import annotations

import re
from pathlib import Path

from checkpoint_exporter.errors import NoDataError
from checkpoint_exporter.sources.telemetry.base import Sample, read_int, read_text

ARPHRD_INFINIBAND = 32


def parse_net_dev(text: str) -> dict[str, tuple[int, int]]:
    """Interface -> (bytes received, bytes transmitted), from procfs net/dev.

    After two header lines, one line an interface: its name and ':' (a large first counter may
    follow it without a space), 8 receive fields (bytes first), then 8 transmit fields (bytes
    first). A line that does not parse is skipped.
    """
    out = {}
    for line in text.splitlines()[2:]:
        name, colon, counters = line.rpartition(":")
        fields = counters.split()
        if colon and len(fields) >= 9 and fields[0].isdigit() and fields[8].isdigit():
            out[name.strip()] = (int(fields[0]), int(fields[8]))
    return out


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
        text = read_text(self.procfs / "net" / "dev")
        if text is None:
            raise NoDataError(f"cannot read {self.procfs / 'net' / 'dev'}")
        counters = parse_net_dev(text)
        out: Sample = {}
        for name in self.devices(sorted(counters)):
            received, sent = counters[name]
            out[(name, "tx_bytes")] = float(sent)
            out[(name, "rx_bytes")] = float(received)
        if not out:
            raise NoDataError(f"no interface matches {self.pattern.pattern!r}")
        return out
