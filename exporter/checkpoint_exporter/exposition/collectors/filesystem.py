"""``--collector.filesystem``: filesystems behind watched paths -- size, space non-root users
can use, the reserve to keep, and whether statvfs answered."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import Metric

from checkpoint_exporter.exposition.collectors.base import (
    MetricSpec,
    NoDataError,
    SnapshotCollector,
)
from checkpoint_exporter.model import Snapshot

_FS = ("mountpoint", "device", "fstype")
FILESYSTEM_SIZE = MetricSpec(
    "checkpoint_filesystem_size_bytes", "gauge", "Size of a filesystem behind a watched path.", _FS
)
FILESYSTEM_AVAIL = MetricSpec(
    "checkpoint_filesystem_avail_bytes",
    "gauge",
    "Bytes available to non-root users on a filesystem behind a watched path.",
    _FS,
)
FILESYSTEM_RESERVE = MetricSpec(
    "checkpoint_filesystem_reserve_ratio",
    "gauge",
    "Share of the filesystem to keep free: the largest capacity_reserve of the jobs on it.",
    _FS,
)
FILESYSTEM_DEVICE_ERROR = MetricSpec(
    "checkpoint_filesystem_device_error",
    "gauge",
    "1 when statvfs on the filesystem failed or did not answer within its time budget "
    "(size and avail then hold the last values read).",
    _FS,
)
JOB_FILESYSTEM_INFO = MetricSpec(
    "checkpoint_job_filesystem_info",
    "gauge",
    "Which filesystem each job's tier lives on.",
    ("training_job", "tier", "mountpoint"),
)


class FilesystemCollector(SnapshotCollector):
    name = "filesystem"
    specs = (
        FILESYSTEM_SIZE, FILESYSTEM_AVAIL, FILESYSTEM_RESERVE, FILESYSTEM_DEVICE_ERROR,
        JOB_FILESYSTEM_INFO,
    )  # fmt: skip

    def collect(self, snapshot: Snapshot) -> Iterable[Metric]:
        if not snapshot.filesystems:
            raise NoDataError("no filesystem probed yet")
        size, avail, reserve, device_error, info = (spec.family() for spec in self.specs)
        for fs in snapshot.filesystems:
            labels = [fs.mountpoint, fs.device, fs.fstype]
            size.add_metric(labels, fs.size_bytes)
            avail.add_metric(labels, fs.avail_bytes)
            reserve.add_metric(labels, fs.reserve_ratio)
            device_error.add_metric(labels, 1 if fs.device_error else 0)
        for job in snapshot.jobs:
            for watched in job.paths:
                if watched.mountpoint:
                    info.add_metric([job.name, watched.tier, watched.mountpoint], 1)
        return [size, avail, reserve, device_error, info]
