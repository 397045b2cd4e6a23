"""The save ledger (core/ledger.py): one record per save, counted exactly once when it ends."""

from __future__ import annotations

from checkpoint_exporter.model import COMMITTED, DURABLE, WRITING

from .builders import T, ev, found, job


def _total(tracker) -> int:
    return sum(dict(tracker.state().save_duration)["total"].counts)


def test_a_save_the_disk_and_its_ranks_both_report_is_counted_once() -> None:
    tracker = job(deadline=60)
    tracker.observe(DURABLE, [], T)
    tracker.observe(DURABLE, [found("step_10", WRITING, T, step=10)], T + 1)
    tracker.observe(DURABLE, [found("step_10", COMMITTED, T, T + 20, step=10)], T + 21)
    assert (tracker.state().saves_committed, _total(tracker)) == (1, 1)
    events = [ev("save_start", T), ev("resume", T + 2), ev("staged", T + 3),
              ev("written", T + 15), ev("committed", T + 20)]  # fmt: skip
    tracker.apply_events(events, T + 22)
    tracker.tick(T + 60)
    state = tracker.state()
    assert (state.saves_committed, _total(tracker), state.saves_within_deadline) == (1, 1, 1)
    # One record, now with the phases only the ranks know.
    assert len(state.recent_saves) == 1
    assert dict(state.recent_saves[0].phases)["write"] == 12.0


def test_a_save_its_ranks_failed_is_counted_once_when_the_disk_shows_it_later() -> None:
    tracker = job(deadline=60, abort_after=120)
    tracker.observe(DURABLE, [], T)
    tracker.apply_events([ev("save_start", T), ev("save_failed", T + 5, error="oom")], T + 6)
    tracker.tick(T + 30)
    assert tracker.state().saves_aborted == 1
    # Its partial generation appears, then stalls past abort_after: the same save, not a second.
    tracker.observe(DURABLE, [found("step_10", WRITING, T + 1, step=10)], T + 31)
    tracker.tick(T + 31 + 121)
    state = tracker.state()
    assert {g.id: g.state for g in state.generations} == {"step_10": "aborted"}
    assert state.saves_aborted == 1
    assert [r.outcome for r in state.recent_saves] == ["aborted"]


def test_a_late_save_is_a_deadline_miss_and_the_two_counters_sum_to_the_histogram() -> None:
    tracker = job(deadline=10)
    tracker.observe(DURABLE, [], T)
    for step, took in ((1, 5.0), (2, 30.0)):
        start = T + 100 * step
        tracker.observe(DURABLE, [found(f"s{step}", WRITING, start, step=step)], start + 1)
        done = found(f"s{step}", COMMITTED, start, start + took, step=step)
        tracker.observe(DURABLE, [done], start + took + 1)
    state = tracker.state()
    assert (state.deadline_misses, state.saves_within_deadline) == (1, 1)
    assert _total(tracker) == 2
    assert [r.outcome for r in state.recent_saves] == ["ok", "late"]


def test_an_abort_is_logged_under_the_trackers_name_as_before_the_split(caplog) -> None:
    tracker = job(abort_after=60)
    tracker.observe(DURABLE, [], T)
    tracker.observe(DURABLE, [found("s", WRITING, T + 1)], T + 2)
    with caplog.at_level("WARNING"):
        tracker.tick(T + 100)
    assert [(r.name, r.getMessage().split(":")[0]) for r in caplog.records] == [
        ("checkpoint_exporter.core.tracker", "save aborted")
    ]
