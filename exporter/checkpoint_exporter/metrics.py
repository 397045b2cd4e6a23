"""The only place metric names are spelled, and the bridge to prometheus_client.

Collectors (``checkpoint_exporter.collectors``) build families from these specs per scrape, out
of the current Snapshot; ``ExporterCollector`` wraps each one, as node_exporter does, with a
success and a duration series, so one broken source never fails the whole scrape.
"""

from __future__ import annotations

import logging
import platform
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import CollectorRegistry

from checkpoint_exporter import __version__
from checkpoint_exporter.model import Snapshot

log = logging.getLogger(__name__)

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


# --- the daemon itself ------------------------------------------------------------------------

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

# --- per training job ----------------------------------------------------------------------

JOB_INFO = MetricSpec(
    "checkpoint_job_info",
    "gauge",
    "What is watched: one series per training job and storage tier.",
    ("training_job", "layout", "tier", "path"),
)
INTERVAL_SECONDS = MetricSpec(
    "checkpoint_interval_seconds",
    "gauge",
    "The job's checkpoint interval objective.",
    ("training_job",),
)
DEADLINE_SECONDS = MetricSpec(
    "checkpoint_deadline_seconds",
    "gauge",
    "The job's deadline from save start to durable commit.",
    ("training_job",),
)
RETAINED_GENERATIONS_LIMIT = MetricSpec(
    "checkpoint_retained_generations_limit",
    "gauge",
    "The job's configured retention: committed generations it should keep.",
    ("training_job",),
)
RESTORE_DRILL_MAX_AGE_SECONDS = MetricSpec(
    "checkpoint_restore_drill_max_age_seconds",
    "gauge",
    "Longest time allowed since the job's last successful restore drill.",
    ("training_job",),
)

ALL: tuple[MetricSpec, ...] = (
    BUILD_INFO,
    SCRAPE_COLLECTOR_SUCCESS,
    SCRAPE_COLLECTOR_DURATION,
    JOB_INFO,
    INTERVAL_SECONDS,
    DEADLINE_SECONDS,
    RETAINED_GENERATIONS_LIMIT,
    RESTORE_DRILL_MAX_AGE_SECONDS,
)


class NoDataError(Exception):
    """Raised by a collector with nothing to report (no GPU, no InfiniBand).

    Reported as success 0, logged at debug level; it is not a failed scrape.
    """


class SnapshotCollector:
    """The small interface every collector implements: metric families from one Snapshot."""

    name: str = ""

    def collect(self, snapshot: Snapshot) -> Iterable[Metric]:
        raise NotImplementedError


class ExporterCollector:
    """A prometheus_client collector that runs every enabled SnapshotCollector per scrape."""

    def __init__(
        self, snapshot: Callable[[], Snapshot], collectors: Sequence[SnapshotCollector]
    ) -> None:
        self._snapshot = snapshot
        self._collectors = tuple(collectors)

    def collect(self) -> Iterator[Metric]:
        snapshot = self._snapshot()
        build = BUILD_INFO.family()
        build.add_metric([__version__, platform.python_version()], 1)
        yield build
        success = SCRAPE_COLLECTOR_SUCCESS.family()
        duration = SCRAPE_COLLECTOR_DURATION.family()
        for collector in self._collectors:
            started = time.perf_counter()
            try:
                families = list(collector.collect(snapshot))
                ok = 1
            except NoDataError as reason:
                families, ok = [], 0
                log.debug(
                    "collector returned no data: collector=%s reason=%s", collector.name, reason
                )
            except Exception:
                families, ok = [], 0
                log.exception("collector failed: collector=%s", collector.name)
            duration.add_metric([collector.name], time.perf_counter() - started)
            success.add_metric([collector.name], ok)
            yield from families
        yield success
        yield duration


def build_registry(
    snapshot: Callable[[], Snapshot],
    collectors: Sequence[SnapshotCollector],
    runtime_metrics: bool = False,
) -> CollectorRegistry:
    """A fresh registry; the process/platform/gc collectors only when asked for."""
    registry = CollectorRegistry()
    registry.register(ExporterCollector(snapshot, collectors))
    if runtime_metrics:
        from prometheus_client import GCCollector, PlatformCollector, ProcessCollector

        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        GCCollector(registry=registry)
    return registry


def reference_table() -> str:
    """The Markdown table of every metric, for docs/metrics.md."""
    rows = ["| name | type | labels | meaning |", "|---|---|---|---|"]
    for spec in ALL:
        labels = ", ".join(f"`{label}`" for label in spec.labels) or "—"
        rows.append(f"| `{spec.name}` | {spec.kind} | {labels} | {spec.help} |")
    return "\n".join(rows) + "\n"
