"""Restores (core/restores.py): counted once, marked on the save they were of."""

from __future__ import annotations

from checkpoint_exporter.core.restores import RESTORE_EXPIRY
from checkpoint_exporter.model import COMMITTED, DURABLE, WRITING

from .builders import T, ev, found, job


def _saved(step: int = 10):
    tracker = job(deadline=60)
    tracker.observe(DURABLE, [], T)
    tracker.observe(DURABLE, [found("s", WRITING, T, step=step)], T + 1)
    tracker.observe(DURABLE, [found("s", COMMITTED, T, T + 20, step=step)], T + 21)
    return tracker


def test_a_restore_whose_ranks_never_report_is_a_failure_once_expired() -> None:
    tracker = _saved()
    tracker.apply_events([ev("restore_start", T + 100)], T + 100)
    tracker.tick(T + 100 + RESTORE_EXPIRY - 1)
    assert tracker.state().restores == 0
    tracker.tick(T + 100 + RESTORE_EXPIRY + 1)
    state = tracker.state()
    assert (state.restores, state.restore_failures) == (1, 1)
    assert state.recent_restores == ()  # nothing reported, nothing to show


def test_a_failed_restore_marks_its_save_until_one_succeeds() -> None:
    tracker = _saved(step=10)
    for at in (T + 100, T + 200):  # two failures of the same generation: one symptom
        tracker.apply_events(
            [ev("restore_start", at), ev("restore_failed", at + 3, error="truncated_shard")],
            at + 3,
        )
        tracker.tick(at + 10)
    state = tracker.state()
    assert (state.restores, state.restore_failures) == (2, 2)
    assert state.recent_saves[-1].symptoms == ("unrestorable",)
    assert dict(state.save_symptoms)["unrestorable"] == 1
    tracker.apply_events([ev("restore_start", T + 300), ev("restore_done", T + 330)], T + 330)
    tracker.tick(T + 340)
    state = tracker.state()
    assert state.recent_saves[-1].symptoms == ()
    assert dict(state.save_symptoms)["unrestorable"] == 1  # the failure happened
    assert (state.restore_last_success, state.restore_last_duration) == (T + 330, 30.0)
