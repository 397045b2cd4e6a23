"""InfiniBand ports: ``port_xmit_data`` / ``port_rcv_data`` count 4-octet units; ``rate`` is
"200 Gb/sec (4X HDR)". Extended 64-bit counters are preferred where a driver has both."""

from __future__ import annotations

import re
from pathlib import Path

from checkpoint_exporter.errors import NoDataError
from checkpoint_exporter.sources.telemetry.base import Sample, read_int, read_text

_RATE = re.compile(r"([\d.]+)\s*Gb/sec")


class InfinibandSource:
    name = "infiniband"

    def __init__(self, sysfs: Path):
        self.root = sysfs / "class" / "infiniband"

    def ports(self) -> list[tuple[str, Path]]:
        """("mlx5_0/1", port directory) for every port."""
        out = []
        try:
            for device in sorted(self.root.iterdir()):
                for port in sorted((device / "ports").iterdir()):
                    out.append((f"{device.name}/{port.name}", port))
        except OSError:
            return out
        return out

    def speed_bits(self, device: str) -> float | None:
        text = read_text(self.root / device.split("/")[0] / "ports" / device.split("/")[1] / "rate")
        match = _RATE.search(text or "")
        return float(match.group(1)) * 1e9 if match else None

    @staticmethod
    def _counter(port: Path, name: str) -> int | None:
        extended = read_int(port / "counters_ext" / f"{name}_64")
        return extended if extended is not None else read_int(port / "counters" / name)

    def sample(self) -> Sample:
        out: Sample = {}
        for device, port in self.ports():
            sent = self._counter(port, "port_xmit_data")
            received = self._counter(port, "port_rcv_data")
            if sent is not None:
                out[(device, "tx_bytes")] = sent * 4.0
            if received is not None:
                out[(device, "rx_bytes")] = received * 4.0
        if not out:
            raise NoDataError("no InfiniBand port counters")
        return out
