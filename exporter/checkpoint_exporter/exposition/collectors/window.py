"""What the network, disks and GPUs of this node did during each job's newest save.

Three collectors, one per kind of telemetry, so ``--no-collector.gpu`` and friends work and a
node without GPUs or InfiniBand reports success 0 for that collector only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import ClassVar

from prometheus_client.core import Metric

from checkpoint_exporter.exposition.collectors.base import (
    MetricSpec,
    NoDataError,
    SnapshotCollector,
)
from checkpoint_exporter.model import Snapshot, WindowTelemetry

Field = Callable[[WindowTelemetry], float | None]

_JOB = ("training_job",)
LAST_SAVE_NETWORK_TRANSMIT = MetricSpec(
    "checkpoint_last_save_network_transmit_bytes",
    "gauge",
    "Bytes sent on the selected NICs and InfiniBand ports during the newest save, this node.",
    _JOB,
)
LAST_SAVE_NETWORK_PEAK = MetricSpec(
    "checkpoint_last_save_network_peak_utilization_ratio",
    "gauge",
    "Highest transmit utilisation of any selected link during the newest save, this node.",
    _JOB,
)
LAST_SAVE_DISK_WRITTEN = MetricSpec(
    "checkpoint_last_save_disk_written_bytes",
    "gauge",
    "Bytes written to the block devices behind the job's paths during the newest save.",
    _JOB,
)
LAST_SAVE_GPU_UTILIZATION = MetricSpec(
    "checkpoint_last_save_gpu_utilization_ratio",
    "gauge",
    "Mean GPU utilisation of this node during the newest save.",
    _JOB,
)
LAST_SAVE_GPU_BASELINE = MetricSpec(
    "checkpoint_last_save_gpu_baseline_utilization_ratio",
    "gauge",
    "Mean GPU utilisation of this node in an equal window just before the newest save.",
    _JOB,
)


class _WindowCollector(SnapshotCollector):
    per_job = True
    sources: ClassVar[tuple[str, ...]] = ()
    fields: ClassVar[tuple[tuple[MetricSpec, Field], ...]] = ()

    def __init_subclass__(cls) -> None:
        super().__init_subclass__()
        cls.specs = tuple(spec for spec, _ in cls.fields)

    def collect(self, snapshot: Snapshot) -> Iterable[Metric]:
        available = dict(snapshot.telemetry)
        if not any(available.get(source) for source in self.sources):
            raise NoDataError(f"no {'/'.join(self.sources)} telemetry on this node")
        families = [(spec.family(), field) for spec, field in self.fields]
        for job in snapshot.jobs:
            if job.window is None:
                continue
            for family, field in families:
                value = field(job.window)
                if value is not None:
                    family.add_metric([job.name], value)
        return [family for family, _ in families]


class NetworkCollector(_WindowCollector):
    name = "network"
    sources = ("network", "infiniband")
    fields = (
        (LAST_SAVE_NETWORK_TRANSMIT, lambda w: w.network_transmit_bytes),
        (LAST_SAVE_NETWORK_PEAK, lambda w: w.network_peak_utilization),
    )


class DiskCollector(_WindowCollector):
    name = "disk"
    sources = ("disk",)
    fields = ((LAST_SAVE_DISK_WRITTEN, lambda w: w.disk_written_bytes),)


class GpuCollector(_WindowCollector):
    name = "gpu"
    sources = ("gpu",)
    fields = (
        (LAST_SAVE_GPU_UTILIZATION, lambda w: w.gpu_utilization),
        (LAST_SAVE_GPU_BASELINE, lambda w: w.gpu_baseline_utilization),
    )
