"""One collector per module, each behind ``base.SnapshotCollector``, holding the specs it fills.

Every collector gets a ``--collector.<name>`` / ``--no-collector.<name>`` flag; ``REGISTRY``
says which exist and which run by default, and ``ALL_SPECS`` lists every metric for
docs/metrics.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from checkpoint_exporter.exposition.collectors.base import (
    RENDERER_SPECS,
    MetricSpec,
    SnapshotCollector,
)
from checkpoint_exporter.exposition.collectors.checkpoints import CheckpointsCollector
from checkpoint_exporter.exposition.collectors.drain import DrainCollector
from checkpoint_exporter.exposition.collectors.exporter import DaemonCollector
from checkpoint_exporter.exposition.collectors.filesystem import FilesystemCollector
from checkpoint_exporter.exposition.collectors.jobs import JobsCollector
from checkpoint_exporter.exposition.collectors.objects import ObjectsCollector
from checkpoint_exporter.exposition.collectors.restores import RestoresCollector
from checkpoint_exporter.exposition.collectors.symptoms import SymptomsCollector
from checkpoint_exporter.exposition.collectors.window import (
    DiskCollector,
    GpuCollector,
    NetworkCollector,
)


@dataclass(frozen=True)
class CollectorEntry:
    factory: type[SnapshotCollector]
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
    SymptomsCollector.name: CollectorEntry(
        SymptomsCollector,
        True,
        "what held each save back: staging-bound, straggler, contention, commit-bound, "
        "backlog, unrestorable, training disturbed",
    ),
    DrainCollector.name: CollectorEntry(
        DrainCollector, True, "staging tier to durable tier: backlog, arrival and drain"
    ),
    FilesystemCollector.name: CollectorEntry(
        FilesystemCollector,
        True,
        "filesystems behind watched paths: size, avail, reserve, statvfs errors",
    ),
    ObjectsCollector.name: CollectorEntry(
        ObjectsCollector,
        True,
        "object storage behind watched paths: requests, errors, open multipart uploads",
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
        DaemonCollector,
        True,
        "the exporter's own work and health: scans, spool, readiness, stuck mounts, reloads",
    ),
}

# Every metric the exporter can export: the renderer's own, then each collector's in REGISTRY
# order (as the --collector flags are listed).
ALL_SPECS: tuple[MetricSpec, ...] = RENDERER_SPECS + tuple(
    spec for entry in REGISTRY.values() for spec in entry.factory.specs
)


def enabled_collectors(choices: dict[str, bool]) -> list[SnapshotCollector]:
    """Instantiate the collectors that ``choices`` (name -> on/off) or their defaults enable."""
    return [
        entry.factory()
        for name, entry in sorted(REGISTRY.items())
        if choices.get(name, entry.enabled_by_default)
    ]
