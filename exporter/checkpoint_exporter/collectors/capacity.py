"""Filesystems behind watched paths: size, space non-root users can use, the reserve to keep."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import Metric

from checkpoint_exporter import metrics
from checkpoint_exporter.model import Snapshot


class CapacityCollector(metrics.SnapshotCollector):
    name = "filesystem"

    def collect(self, snapshot: Snapshot) -> Iterable[Metric]:
        if not snapshot.filesystems:
            raise metrics.NoDataError("no filesystem probed yet")
        size = metrics.FILESYSTEM_SIZE.family()
        avail = metrics.FILESYSTEM_AVAIL.family()
        reserve = metrics.FILESYSTEM_RESERVE.family()
        for fs in snapshot.filesystems:
            labels = [fs.mountpoint, fs.device, fs.fstype]
            size.add_metric(labels, fs.size_bytes)
            avail.add_metric(labels, fs.avail_bytes)
            reserve.add_metric(labels, fs.reserve_ratio)
        info = metrics.JOB_FILESYSTEM_INFO.family()
        for job in snapshot.jobs:
            for watched in job.paths:
                if watched.mountpoint:
                    info.add_metric([job.name, watched.tier, watched.mountpoint], 1)
        return [size, avail, reserve, info]
