"""The facts a JobState derives once, when the core builds it (model.JobState)."""

from __future__ import annotations

from dataclasses import replace

from checkpoint_exporter.model import COMMITTED, DURABLE, STAGING, WRITING, Generation, JobState

from .builders import T, found, job


def _gen(gen_id: str, tier: str, state: str, start: float, commit: float | None, step: int):
    return Generation(gen_id, tier, step, state, start, commit or start, commit, 10, 1)


def _state(*generations: Generation, **kw) -> JobState:
    return JobState("j", "dcp", (), 60.0, 30.0, 3, 86400.0, generations=generations, **kw)


def test_the_newest_committed_is_the_durable_one_a_restore_would_pick() -> None:
    state = _state(
        _gen("a", DURABLE, COMMITTED, T, T + 10, 1),
        _gen("b", DURABLE, COMMITTED, T + 20, T + 25, 2),
        _gen("c", STAGING, COMMITTED, T + 30, T + 40, 3),  # staging: not restorable from here
        _gen("d", DURABLE, WRITING, T + 50, None, 4),
    )
    assert state.newest_committed is not None and state.newest_committed.id == "b"
    # Replacing the generations derives it again; it is never passed in.
    assert replace(state, generations=()).newest_committed is None


def test_the_last_save_phases_are_the_ranks_else_the_disk_total() -> None:
    disk_only = _state(_gen("b", DURABLE, COMMITTED, T + 20, T + 25, 2))
    assert disk_only.last_save_phases == (("total", 5.0),)
    timed = replace(disk_only, last_phases=(("total", 4.0), ("write", 3.0)))
    assert timed.last_save_phases == (("total", 4.0), ("write", 3.0))
    # A commit dated before its first write (one mtime copied over): never negative.
    skewed = _state(_gen("b", DURABLE, COMMITTED, T + 20, T + 10, 2))
    assert skewed.last_save_phases == (("total", 0.0),)


def test_the_tracker_publishes_them() -> None:
    tracker = job()
    tracker.observe(DURABLE, [found("s1", COMMITTED, T, T + 7, step=1)], T + 100)
    state = tracker.state()
    assert state.newest_committed is not None and state.newest_committed.id == "s1"
    assert state.last_phases == () and state.last_save_phases == (("total", 7.0),)
