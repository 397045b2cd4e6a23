"""Liveness (core/liveness.py): signs of life, heartbeats, finished."""

from __future__ import annotations

from checkpoint_exporter.core.liveness import FINISHED_GRACE
from checkpoint_exporter.model import DURABLE, WRITING

from .builders import T, ev, found, job


def test_a_heartbeat_within_the_grace_after_finished_is_the_same_run_winding_down() -> None:
    tracker = job()
    tracker.apply_events([ev("finished", T + 10)], T + 10)
    tracker.apply_events([ev("heartbeat", T + 10 + FINISHED_GRACE - 1, rank=1)], T + 700)
    assert tracker.finished and tracker.state().finished_at == T + 10
    tracker.apply_events([ev("heartbeat", T + 10 + FINISHED_GRACE + 1, rank=1)], T + 700)
    assert not tracker.finished
    assert tracker.state().heartbeat_at == T + 10 + FINISHED_GRACE + 1


def test_a_write_is_a_sign_of_life_never_later_than_now() -> None:
    tracker = job()
    tracker.observe(DURABLE, [], T)
    tracker.observe(DURABLE, [found("s", WRITING, T + 5_000)], T + 10)  # dated ahead
    assert tracker.state().alive_at == T + 10


def test_a_new_tracker_of_the_job_takes_its_life() -> None:
    old, new = job(), job()
    old.first_seen = T - 100
    old.apply_events([ev("heartbeat", T + 1), ev("finished", T + 2)], T + 3)
    version = new.version
    new.take_life(old.life())
    assert (new.first_seen, new.alive_at, new.finished_at, new.heartbeat_at) == (
        T - 100, T + 2, T + 2, T + 1,
    )  # fmt: skip
    assert new.version != version
