"""One collector per module, each behind ``metrics.SnapshotCollector``.

Every collector gets a ``--collector.<name>`` / ``--no-collector.<name>`` flag; ``REGISTRY``
says which exist and which run by default.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from checkpoint_exporter.collectors.capacity import CapacityCollector
from checkpoint_exporter.collectors.checkpoints import CheckpointsCollector
from checkpoint_exporter.collectors.drain import DrainCollector
from checkpoint_exporter.collectors.exporter import DaemonCollector
from checkpoint_exporter.collectors.jobs import JobsCollector
from checkpoint_exporter.collectors.restores import RestoresCollector
from checkpoint_exporter.collectors.window import DiskCollector, GpuCollector, NetworkCollector
from checkpoint_exporter.metrics import SnapshotCollector


@dataclass(frozen=True)
class CollectorEntry:
    factory: Callable[[], SnapshotCollector]
    enabled_by_default: bool
    help: str


REGISTRY: dict[str, CollectorEntry] = {
    JobsCollector.name: CollectorEntry(
        JobsCollector, True, "watched jobs and their objectives (interval, deadline, retention)"
    ),
    CheckpointsCollector.name: CollectorEntry(
        CheckpointsCollector, True, "generations on disk: newest committed, in progress, counts"
    ),
    RestoresCollector.name: CollectorEntry(
        RestoresCollector, True, "restores: drills and loads reported by training jobs"
    ),
    DrainCollector.name: CollectorEntry(
        DrainCollector, True, "staging tier to durable tier: backlog, arrival and drain"
    ),
    CapacityCollector.name: CollectorEntry(
        CapacityCollector, True, "filesystems behind watched paths: size, avail, reserve"
    ),
    NetworkCollector.name: CollectorEntry(
        NetworkCollector, True, "NIC and InfiniBand traffic during each job's newest save"
    ),
    DiskCollector.name: CollectorEntry(
        DiskCollector, True, "bytes written to the backing disks during each job's newest save"
    ),
    GpuCollector.name: CollectorEntry(
        GpuCollector, True, "GPU utilisation during, and just before, each job's newest save"
    ),
    DaemonCollector.name: CollectorEntry(
        DaemonCollector, True, "the exporter's own scanning: durations, operations, errors"
    ),
}


def enabled_collectors(choices: dict[str, bool]) -> list[SnapshotCollector]:
    """Instantiate the collectors that ``choices`` (name -> on/off) or their defaults enable."""
    return [
        entry.factory()
        for name, entry in sorted(REGISTRY.items())
        if choices.get(name, entry.enabled_by_default)
    ]
