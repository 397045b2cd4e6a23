"""This node's telemetry, assembled from the config: sources, sampler, correlation. (Filesystem
capacity is the daemon's own statvfs probe, on each mount's worker: daemon/health.py.)"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass

from checkpoint_exporter.config import Config
from checkpoint_exporter.model import WindowTelemetry
from checkpoint_exporter.sources.telemetry.correlate import correlate
from checkpoint_exporter.sources.telemetry.disk import BlockDevice, DiskSource, resolve
from checkpoint_exporter.sources.telemetry.gpu import GpuSource
from checkpoint_exporter.sources.telemetry.infiniband import InfinibandSource
from checkpoint_exporter.sources.telemetry.net import NetSource
from checkpoint_exporter.sources.telemetry.sampler import Sampler
from checkpoint_exporter.sources.watch import Mount

log = logging.getLogger(__name__)

STOP_TIMEOUT = 0.5  # the most stop() waits in all, so SIGTERM ends the process within 2 s


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

    def start(self) -> None:
        self.sampler.sample_once()  # a first sample now, so the first window has a "before"
        self.sampler.start()

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """Returns within ``timeout``, whatever the GPU driver does: a sampler or NVML call still
        hung by then is left on its daemon thread (the process's exit ends it)."""
        deadline = time.monotonic() + timeout
        self.sampler.stop(timeout)
        if self.gpu is not None:
            self.gpu.close(max(0.0, deadline - time.monotonic()))

    def place(self, path: str, mount: Mount | None) -> Placement:
        """Register a watched path: its disk is sampled."""
        device = resolve(self.sysfs, mount.major_minor) if mount else None
        if device is not None:
            self.disk.add(device.name)
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

    def available(self) -> tuple[tuple[str, bool], ...]:
        return tuple(sorted(self.sampler.available.items()))
