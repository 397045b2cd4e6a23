"""What the network, disks and GPUs of this node did during each job's newest save.

Three collectors, one per kind of telemetry, so ``--no-collector.gpu`` and friends work and a
node without GPUs or InfiniBand reports success 0 for that collector only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client.core import Metric

from checkpoint_exporter import metrics
from checkpoint_exporter.correlate import WindowTelemetry
from checkpoint_exporter.model import Snapshot

Field = Callable[[WindowTelemetry], float | None]


class _WindowCollector(metrics.SnapshotCollector):
    per_job = True
    sources: tuple[str, ...] = ()
    fields: tuple[tuple[metrics.MetricSpec, Field], ...] = ()

    def collect(self, snapshot: Snapshot) -> Iterable[Metric]:
        available = dict(snapshot.telemetry)
        if not any(available.get(source) for source in self.sources):
            raise metrics.NoDataError(f"no {'/'.join(self.sources)} telemetry on this node")
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
        (metrics.LAST_SAVE_NETWORK_TRANSMIT, lambda w: w.network_transmit_bytes),
        (metrics.LAST_SAVE_NETWORK_PEAK, lambda w: w.network_peak_utilization),
    )


class DiskCollector(_WindowCollector):
    name = "disk"
    sources = ("disk",)
    fields = ((metrics.LAST_SAVE_DISK_WRITTEN, lambda w: w.disk_written_bytes),)


class GpuCollector(_WindowCollector):
    name = "gpu"
    sources = ("gpu",)
    fields = (
        (metrics.LAST_SAVE_GPU_UTILIZATION, lambda w: w.gpu_utilization),
        (metrics.LAST_SAVE_GPU_BASELINE, lambda w: w.gpu_baseline_utilization),
    )
