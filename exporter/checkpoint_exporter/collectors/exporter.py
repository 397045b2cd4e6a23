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
        events = metrics.SPOOL_EVENTS.family()
        for event, count in daemon.spool_events:
            events.add_metric([event], count)
        invalid = metrics.SPOOL_INVALID.family()
        for reason, count in daemon.spool_invalid:
            invalid.add_metric([reason], count)
        dropped = metrics.SPOOL_DROPPED.family()
        for reason, count in daemon.spool_dropped:
            dropped.add_metric([reason], count)
        dropped_bytes = metrics.SPOOL_DROPPED_BYTES.family()
        for reason, count in daemon.spool_dropped_bytes:
            dropped_bytes.add_metric([reason], count)
        out += [events, invalid, dropped, dropped_bytes]
        out.append(metrics.SPOOL_BACKLOG.single(daemon.spool_backlog_bytes))
        out.append(metrics.SPOOL_POLL_SECONDS.single(daemon.spool_poll_seconds))
        excess = metrics.DISCOVER_EXCESS.family()
        for root, count in daemon.discover_excess:
            excess.add_metric([root], count)
        out.append(excess)
        return out
