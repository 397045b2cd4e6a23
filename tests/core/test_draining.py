"""Staging to durable (core/drain.py Draining): bytes counted once, lost generations."""

from __future__ import annotations

from checkpoint_exporter.model import COMMITTED, DURABLE, STAGING

from .builders import T, found, job


def test_staged_and_drained_bytes_count_once_and_a_generation_deleted_undrained_is_lost() -> None:
    tracker = job(two_tier=True)
    tracker.observe(DURABLE, [], T)
    tracker.observe(STAGING, [], T)
    a, b = found("a", COMMITTED, T, T + 1, size=100), found("b", COMMITTED, T, T + 2, size=50)
    tracker.observe(STAGING, [a, b], T + 3)
    tracker.observe(STAGING, [a, b], T + 4)  # read again: nothing new
    state = tracker.state()
    assert (state.staged_bytes, state.drain_backlog_generations) == (150, 2)
    tracker.observe(DURABLE, [found("a", COMMITTED, T, T + 5, size=100)], T + 6)
    tracker.observe(STAGING, [b], T + 7)  # a drained and retired; b deleted undrained
    state = tracker.state()
    assert (state.drained_bytes, state.lost_generations) == (100, 0)
    tracker.observe(STAGING, [], T + 8)
    assert tracker.state().lost_generations == 1
