"""The exporter's own work: scan durations, metadata operations, errors, watch overflows."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import Metric

from checkpoint_exporter import metrics
from checkpoint_exporter.model import Snapshot


class DaemonCollector(metrics.SnapshotCollector):
    name = "exporter"

    def collect(self, snapshot: Snapshot) -> Iterable[Metric]:
        daemon = snapshot.daemon
        out = [
            metrics.SCAN_OPERATIONS.single(daemon.metadata_operations),
            metrics.SCAN_ERRORS.single(daemon.scan_errors),
            metrics.WATCH_OVERFLOWS.single(daemon.watch_overflows),
        ]
        if daemon.scans is not None:
            scans = metrics.SCAN_DURATION.family()
            metrics.add_histogram(scans, [], daemon.scans)
            out.append(scans)
        out += [
            _by_label(metrics.SPOOL_EVENTS, daemon.spool_events),
            _by_label(metrics.SPOOL_INVALID, daemon.spool_invalid),
            _by_label(metrics.SPOOL_DROPPED, daemon.spool_dropped),
            _by_label(metrics.SPOOL_DROPPED_BYTES, daemon.spool_dropped_bytes),
        ]
        out.append(metrics.SPOOL_BACKLOG.single(daemon.spool_backlog_bytes))
        out.append(metrics.SPOOL_POLL_SECONDS.single(daemon.spool_poll_seconds))
        excess = metrics.DISCOVER_EXCESS.family()
        for root, count in daemon.discover_excess:
            excess.add_metric([root], count)
        out.append(excess)
        return out


def _by_label(spec: metrics.MetricSpec, counts: tuple[tuple[str, float], ...]) -> Metric:
    """One family with a sample per (label value, count)."""
    family = spec.family()
    for value, count in counts:
        family.add_metric([value], count)
    return family
