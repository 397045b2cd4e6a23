"""Diagnosing (core/diagnosing.py): which spans hold the storage, when a save is diagnosed."""

from __future__ import annotations

import math

from checkpoint_exporter.core.diagnosing import OPEN_SAVE_DEADLINES
from checkpoint_exporter.model import COMMITTED, DURABLE, WRITING, WindowTelemetry

from .builders import T, ev, found, job


def test_a_save_in_progress_holds_the_storage_open_ended_its_ranks_for_a_while() -> None:
    tracker = job(deadline=10)
    tracker.observe(DURABLE, [], T)
    tracker.observe(DURABLE, [found("s", WRITING, T + 1)], T + 2)
    assert tracker.busy_spans() == [(T + 1, math.inf)]
    other = job(deadline=10)
    other.apply_events([ev("save_start", T)], T + 1)
    assert other.busy_spans() == [(T, T + OPEN_SAVE_DEADLINES * 10)]


def test_a_finished_save_waits_for_its_windows_telemetry() -> None:
    tracker = job(deadline=10)
    tracker.observe(DURABLE, [], T)
    tracker.observe(DURABLE, [found("s", WRITING, T + 1, step=1)], T + 2)
    tracker.observe(DURABLE, [found("s", COMMITTED, T + 1, T + 5, step=1)], T + 6)
    assert tracker.last_window == (T + 1, T + 5)
    due = tracker.next_due(T + 6)
    assert due is not None and due > T + 6  # held until the telemetry or the grace
    version = tracker.version
    tracker.set_window_telemetry(WindowTelemetry(T + 1, T + 5, network_transmit_bytes=1.0))
    assert tracker.version != version
    assert tracker.state().window == WindowTelemetry(T + 1, T + 5, network_transmit_bytes=1.0)
    assert tracker.next_due(T + 6) is None  # diagnosed: nothing left to wait for
