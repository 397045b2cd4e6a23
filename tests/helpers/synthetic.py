"""Trackers filled with synthetic jobs: every per-job series the exporter has, without a disk.

Shared by the exposition tests and the scrape benchmark.
"""

from __future__ import annotations

import time

from checkpoint_exporter.config import Config, Policy
from checkpoint_exporter.core.jobs import Tracker
from checkpoint_exporter.core.tracker import JobTracker
from checkpoint_exporter.model import COMMITTED, DURABLE, STAGING, WatchedPath, WindowTelemetry
from checkpoint_exporter.sources.layouts.base import Found
from checkpoint_exporter.sources.spool import Event

_POINTS = ("save_start", "resume", "staged", "written", "committed")


def generations(count: int, now: float, first_step: int = 0) -> list[Found]:
    return [
        Found(f"step-{step}", step, COMMITTED, now - 900 * (count - index),
              now - 900 * (count - index) + 30, now - 900 * (count - index) + 30, 10**9, 1000)
        for index, step in enumerate(range(first_step, first_step + count))
    ]  # fmt: skip


def synthetic_job(name: str, count: int, now: float, two_tier: bool = False) -> JobTracker:
    """An instrumented job with ``count`` committed generations, the newest saved live."""
    paths = [WatchedPath(DURABLE, f"/ckpt/{name}", "inotify", "/ckpt")]
    if two_tier:
        paths.append(WatchedPath(STAGING, f"/nvme/{name}", "inotify", "/nvme"))
    job = JobTracker(name, tuple(paths), Policy())
    found = generations(count, now)
    job.observe(DURABLE, found[:-1], now - 1000)
    if two_tier:
        job.observe(STAGING, found[-2:], now - 1000)
    events = [
        Event(now - 40 + offset, event, name, count - 1, 0, 1, "node", None, None, None)
        for offset, event in enumerate(_POINTS)
    ]
    job.apply_events(events, now - 10)
    job.observe(DURABLE, found, now - 5)
    job.tick(now)
    job.set_window_telemetry(WindowTelemetry(now - 40, now - 36, 1e9, 0.5, 2e9, 0.9, 0.3))
    return job


def synthetic_tracker(jobs: int, count: int, names: list[str] | None = None) -> Tracker:
    tracker = Tracker(Config())
    now = time.time()
    for index in range(jobs):
        name = names[index] if names and index < len(names) else f"job-{index}"
        tracker.add(synthetic_job(name, count, now, two_tier=index % 3 == 0))
    tracker.publish(telemetry=(("disk", True), ("gpu", True), ("network", True)))
    return tracker
