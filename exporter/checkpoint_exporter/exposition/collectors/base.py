"""What every collector is built from, and the series the renderer adds around them.

A collector module spells the ``MetricSpec`` s it fills beside the code that fills them (as
node_exporter's collector files do), so a metric's name leads in one hop to where its value is
born. Here: the spec type, the collector interface, and the three specs no collector owns
(build info, and each collector's success and duration, filled by ``exposition.Renderer``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import ClassVar

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString

from checkpoint_exporter.errors import NoDataError
from checkpoint_exporter.model import HistogramState, Snapshot

__all__ = [
    "BUILD_INFO",
    "RENDERER_SPECS",
    "SCRAPE_COLLECTOR_DURATION",
    "SCRAPE_COLLECTOR_SUCCESS",
    "MetricSpec",
    "NoDataError",
    "SnapshotCollector",
    "add_histogram",
    "by_label",
]

_FAMILIES = {
    "gauge": GaugeMetricFamily,
    "counter": CounterMetricFamily,
    "histogram": HistogramMetricFamily,
}


@dataclass(frozen=True)
class MetricSpec:
    name: str
    kind: str  # gauge | counter | histogram
    help: str
    labels: tuple[str, ...] = ()

    def family(self) -> Metric:
        return _FAMILIES[self.kind](self.name, self.help, labels=list(self.labels))

    def single(self, value: float) -> Metric:
        """A family holding one unlabelled sample."""
        family = self.family()
        family.add_metric([], value)
        return family


def add_histogram(family: Metric, labels: list[str], histogram: HistogramState) -> None:
    buckets = [(floatToGoString(bound), count) for bound, count in histogram.cumulative()]
    family.add_metric(labels, buckets, histogram.sum)


def by_label(spec: MetricSpec, counts: Iterable[tuple[str, float]]) -> Metric:
    """One family with a sample per (label value, value)."""
    family = spec.family()
    for label, value in counts:
        family.add_metric([label], value)
    return family


class SnapshotCollector:
    """The small interface every collector implements: metric families from one Snapshot."""

    name: ClassVar[str] = ""
    # Every spec the collector fills, in the order it yields them (docs/metrics.md lists them).
    specs: ClassVar[tuple[MetricSpec, ...]] = ()
    # Its samples for a job depend only on that job (and on which telemetry sources have data),
    # so exposition.Renderer may ask for one job at a time and keep unchanged jobs' lines.
    per_job: ClassVar[bool] = False

    def collect(self, snapshot: Snapshot) -> Iterable[Metric]:
        raise NotImplementedError


BUILD_INFO = MetricSpec(
    "checkpoint_exporter_build_info",
    "gauge",
    "A metric with a constant '1' value labelled by the exporter's version.",
    ("version", "python_version"),
)
SCRAPE_COLLECTOR_SUCCESS = MetricSpec(
    "checkpoint_exporter_scrape_collector_success",
    "gauge",
    "1 if the collector produced data on this scrape; 0 if it failed or had no data.",
    ("collector",),
)
SCRAPE_COLLECTOR_DURATION = MetricSpec(
    "checkpoint_exporter_scrape_collector_duration_seconds",
    "gauge",
    "Time the collector took on this scrape.",
    ("collector",),
)
RENDERER_SPECS = (BUILD_INFO, SCRAPE_COLLECTOR_SUCCESS, SCRAPE_COLLECTOR_DURATION)
