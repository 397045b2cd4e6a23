"""This node's telemetry, assembled from the config: sources, sampler, capacity, correlation."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass

from checkpoint_exporter.config import Config
from checkpoint_exporter.correlate import WindowTelemetry, correlate
from checkpoint_exporter.model import FilesystemState
from checkpoint_exporter.telemetry.disk import BlockDevice, DiskSource, resolve
from checkpoint_exporter.telemetry.filesystem import CapacityMonitor
from checkpoint_exporter.telemetry.gpu import GpuSource
from checkpoint_exporter.telemetry.infiniband import InfinibandSource
from checkpoint_exporter.telemetry.net import NetSource
from checkpoint_exporter.telemetry.sampler import Sampler
from checkpoint_exporter.watch import Mount

log = logging.getLogger(__name__)

CAPACITY_INTERVAL = 15.0


@dataclass(frozen=True)
class Placement:
    """Where a watched path lives."""

    mount: Mount | None
    block_device: BlockDevice | None


class NodeTelemetry:
    def __init__(self, config: Config):
        paths, telemetry = config.paths, config.telemetry
        self.net = NetSource(
            paths.procfs, paths.sysfs, telemetry.network_devices, skip_ipoib=telemetry.infiniband
        )
        self.infiniband = InfinibandSource(paths.sysfs) if telemetry.infiniband else None
        self.disk = DiskSource(paths.procfs)
        self.gpu = GpuSource(required=telemetry.gpu == "on") if telemetry.gpu != "off" else None
        sources = [s for s in (self.net, self.infiniband, self.disk, self.gpu) if s is not None]
        self.sampler = Sampler(sources, telemetry.sample_interval, telemetry.retention)
        self.sysfs = paths.sysfs
        self.capacity = CapacityMonitor()
        self._capacity_targets: dict[str, tuple[str, str, str]] = {}
        self._stop = threading.Event()
        self._capacity_thread = threading.Thread(target=self._probe, name="capacity", daemon=True)

    def start(self) -> None:
        self.sampler.sample_once()  # a first sample now, so the first window has a "before"
        self.capacity.probe(dict(self._capacity_targets))
        self.sampler.start()
        self._capacity_thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.sampler.stop()
        self.capacity.close()
        if self.gpu is not None:
            self.gpu.close()

    def _probe(self) -> None:
        while not self._stop.wait(CAPACITY_INTERVAL):
            self.capacity.probe(dict(self._capacity_targets))

    def place(self, path: str, mount: Mount | None) -> Placement:
        """Register a watched path: its disk is sampled and its filesystem's capacity probed."""
        device = resolve(self.sysfs, mount.major_minor) if mount else None
        if device is not None:
            self.disk.devices.add(device.name)
        if mount is not None:
            self._capacity_targets.setdefault(mount.mountpoint, (path, mount.device, mount.fstype))
        return Placement(mount, device)

    def correlate(self, start: float, end: float, disks: Iterable[str]) -> WindowTelemetry:
        transmit = {
            **self.sampler.series("network", "tx_bytes"),
            **self.sampler.series("infiniband", "tx_bytes"),
        }
        speeds = {device: self._speed(device) for device in transmit}
        wanted = set(disks)
        disks_written = self.sampler.series("disk", "written_bytes")
        written = {d: ring for d, ring in disks_written.items() if d in wanted}
        return correlate(
            start, end, transmit, speeds, written, self.sampler.series("gpu", "utilization")
        )

    def _speed(self, device: str) -> float | None:
        if "/" in device and self.infiniband is not None:
            return self.infiniband.speed_bits(device)
        return self.net.speed_bits(device)

    def filesystems(self, reserves: dict[str, float]) -> tuple[FilesystemState, ...]:
        return tuple(
            FilesystemState(
                c.mountpoint,
                c.device,
                c.fstype,
                c.size_bytes,
                c.avail_bytes,
                reserves.get(c.mountpoint, 0.0),
            )
            for c in sorted(self.capacity.latest.values(), key=lambda c: c.mountpoint)
        )

    def available(self) -> tuple[tuple[str, bool], ...]:
        return tuple(sorted(self.sampler.available.items()))
