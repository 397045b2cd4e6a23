"""Per-save-window arithmetic over telemetry samples: what the network, the disks and the GPUs
did between a save's start and its commit, on this node.

Counters are integrated segment by segment (a counter that goes down was reset: its new value is
the increment), so a window between two samples still gets its share; gauges are averaged over
time with linear interpolation. No sample near the window means no value, never a made-up zero.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from checkpoint_exporter.model import WindowTelemetry
from checkpoint_exporter.sources.telemetry.ring import Ring

Series = tuple[list[float], list[float]]  # times, values


def _segments(series: Series) -> Iterable[tuple[float, float, float, float]]:
    times, values = series
    for i in range(1, len(times)):
        if times[i] > times[i - 1]:
            yield times[i - 1], times[i], values[i - 1], values[i]


def _overlap(t0: float, t1: float, start: float, end: float) -> float:
    return max(0.0, min(t1, end) - max(t0, start))


def counter_delta(series: Series, start: float, end: float) -> float | None:
    """How much a cumulative counter grew between ``start`` and ``end``."""
    total, covered = 0.0, False
    for t0, t1, v0, v1 in _segments(series):
        if t1 < start or t0 > end:
            continue
        covered = True
        increment = v1 - v0 if v1 >= v0 else v1  # a reset: it counted up from zero again
        total += increment * _overlap(t0, t1, start, end) / (t1 - t0)
    return total if covered else None


def peak_rate(series: Series, start: float, end: float) -> float | None:
    """The highest per-second rate of a counter over the sample intervals touching the window."""
    best = None
    for t0, t1, v0, v1 in _segments(series):
        if t1 < start or t0 > end:
            continue
        rate = (v1 - v0 if v1 >= v0 else v1) / (t1 - t0)
        best = rate if best is None else max(best, rate)
    return best


def gauge_mean(series: Series, start: float, end: float) -> float | None:
    """Time-weighted mean of a gauge over the window (the value itself for an instant)."""
    area = span = 0.0
    for t0, t1, v0, v1 in _segments(series):
        low, high = max(t0, start), min(t1, end)
        if high < low or (high == low and not (t0 <= start <= t1)):
            continue
        slope = (v1 - v0) / (t1 - t0)
        a, b = v0 + slope * (low - t0), v0 + slope * (high - t0)
        if high == low:
            return a  # an instant inside this segment
        area += (a + b) / 2 * (high - low)
        span += high - low
    return area / span if span > 0 else None


def _sum(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def _mean(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


def correlate(
    start: float,
    end: float,
    transmit: Mapping[str, Ring],
    link_bits: Mapping[str, float | None],
    written: Mapping[str, Ring],
    gpu_utilization: Mapping[str, Ring],
) -> WindowTelemetry:
    """Everything this node saw during one save window (and, for GPUs, just before it)."""
    net = {d: ring.samples(start, end) for d, ring in transmit.items()}
    utilizations = []
    for device, series in net.items():
        rate, speed = peak_rate(series, start, end), link_bits.get(device)
        if rate is not None and speed:
            utilizations.append(rate * 8 / speed)
    before = start - max(end - start, 1.0)
    gpus = {d: ring.samples(before, end) for d, ring in gpu_utilization.items()}
    return WindowTelemetry(
        start=start,
        end=end,
        network_transmit_bytes=_sum(counter_delta(s, start, end) for s in net.values()),
        network_peak_utilization=max(utilizations) if utilizations else None,
        disk_written_bytes=_sum(
            counter_delta(ring.samples(start, end), start, end) for ring in written.values()
        ),
        gpu_utilization=_mean(gauge_mean(s, start, end) for s in gpus.values()),
        gpu_baseline_utilization=_mean(gauge_mean(s, before, start) for s in gpus.values()),
    )
