"""The four clocks from spool events, joined to the generations found on disk."""

from __future__ import annotations

import math
from collections import Counter

from checkpoint_exporter.config import Policy
from checkpoint_exporter.core.clocks import (
    MAX_ERRORS,
    MAX_OPEN_RESTORES,
    MAX_OPEN_SAVES,
    MAX_RANKS,
    MAX_SECONDS,
    Clocks,
    phases_of,
)
from checkpoint_exporter.core.tracker import JobTracker
from checkpoint_exporter.model import COMMITTED, DURABLE, WRITING, WatchedPath
from checkpoint_exporter.sources.layouts.base import Found
from checkpoint_exporter.sources.spool import FUTURE_SLACK, Event

T = 1_800_000_000.0


def ev(event: str, ts: float, step: int | None = 10, rank: int = 0, **kw) -> Event:
    return Event(
        ts, event, "j", step, rank, kw.pop("world_size", 2), kw.pop("host", "n1"),
        kw.pop("path", None), None, kw.pop("error", None), kw.pop("history", False),
    )  # fmt: skip


def feed(tracker: JobTracker, events: list[Event], now: float, settle: bool = True) -> None:
    """Apply events, then let the spool settle (no rank heard from for a moment)."""
    tracker.apply_events(events, now)
    if settle:
        tracker.tick(now + 1)


def save(rank: int, start: float, resume: float, staged: float, written: float, committed: float,
         step: int = 10) -> list[Event]:  # fmt: skip
    return [ev("save_start", start, step, rank), ev("resume", resume, step, rank),
            ev("staged", staged, step, rank), ev("written", written, step, rank),
            ev("committed", committed, step, rank)]  # fmt: skip


def job(deadline: float = 60) -> JobTracker:
    tracker = JobTracker("j", (WatchedPath(DURABLE, "/ckpt/j"),), Policy(deadline=deadline))
    tracker.observe(DURABLE, [], T)  # history scanned: nothing on disk yet
    return tracker


def hist(tracker: JobTracker, phase: str):
    return dict(tracker.state().save_duration)[phase]


def test_phases_of_one_rank() -> None:
    events = {"save_start": 0.0, "resume": 2.0, "staged": 3.0, "written": 10.0, "committed": 11.5}
    assert phases_of(events) == {
        "pause": 2.0, "staging": 3.0, "write": 7.0, "commit": 1.5, "total": 11.5,
    }  # fmt: skip
    assert phases_of({"save_start": 5.0, "committed": 4.0}) == {"total": 0.0}  # never negative


def test_each_phase_is_the_slowest_local_rank() -> None:
    tracker = job(deadline=20)
    feed(tracker, save(0, T, T + 1, T + 2, T + 9, T + 10), T + 10, settle=False)
    assert tracker.state().last_phases == ()  # rank 1's start may still be unread
    feed(tracker, save(1, T, T + 3, T + 4, T + 15, T + 16), T + 16)
    state = tracker.state()
    assert dict(state.last_phases) == {
        "pause": 3.0, "staging": 4.0, "write": 11.0, "commit": 1.0, "total": 16.0,
    }  # fmt: skip
    assert state.last_write_end == T + 15 and state.last_write_spread == 6.0
    assert all(
        hist(tracker, phase).count == 1
        for phase in ("pause", "staging", "write", "commit", "total")
    )
    assert state.deadline_misses == 0


def test_disk_commit_and_events_count_the_save_once() -> None:
    tracker = job(deadline=5)
    feed(tracker, [ev("save_start", T), ev("resume", T + 1)], T + 1)
    gen = Found("step-10", 10, WRITING, T, T + 2, None, 10, 1)
    tracker.observe(DURABLE, [gen], T + 2)
    committed = Found("step-10", 10, COMMITTED, T, T + 8, T + 8, 10, 1)
    tracker.observe(DURABLE, [committed], T + 8)  # the disk sees the commit first
    assert hist(tracker, "total").count == 0  # waiting for the ranks' own account
    feed(tracker, [ev("staged", T + 2), ev("written", T + 7), ev("committed", T + 8)], T + 9)
    assert hist(tracker, "total").count == 1 and hist(tracker, "pause").count == 1
    assert tracker.state().deadline_misses == 1 and tracker.state().saves_committed == 1


def test_events_first_then_disk_does_not_count_twice() -> None:
    tracker = job()
    feed(tracker, save(0, T, T + 1, T + 1, T + 4, T + 5, step=20), T + 5)
    tracker.observe(DURABLE, [Found("step-20", 20, COMMITTED, T, T + 5, T + 5, 10, 1)], T + 6)
    assert hist(tracker, "total").count == 1


def test_events_read_after_a_disk_only_commit_do_not_count_the_save_again() -> None:
    """The spool fell behind (a flood, the per-poll budget): the save's commit was read from the
    disk before any of its events, so the disk timed it alone. Its events, read later, set the
    phase gauges but must not count the save a second time."""
    tracker = job(deadline=5)
    tracker.observe(DURABLE, [Found("step-10", 10, COMMITTED, T, T + 4, T + 4, 10, 1)], T + 4)
    assert hist(tracker, "total").count == 1
    feed(tracker, save(0, T, T + 1, T + 1, T + 3, T + 4), T + 6)
    state = tracker.state()
    assert hist(tracker, "total").count == 1 and "pause" not in dict(state.save_duration)
    assert state.saves_committed == 1 and state.saves_within_deadline == 1
    assert dict(state.last_phases)["pause"] == 1.0  # the gauges take the ranks' account


def test_an_uninstrumented_save_is_timed_from_disk() -> None:
    tracker = job()
    tracker.observe(DURABLE, [Found("step-30", 30, COMMITTED, T, T + 3, T + 3, 10, 1)], T + 4)
    assert hist(tracker, "total").count == 1 and dict(tracker.state().last_phases) == {"total": 3.0}


def test_an_object_store_save_gets_phases_from_events_alone() -> None:
    tracker = job(deadline=10)
    feed(tracker, save(0, T, T + 1, T + 2, T + 20, T + 21, step=40), T + 21)
    assert hist(tracker, "write").sum == 18 and tracker.state().deadline_misses == 1
    assert tracker.state().saves_committed == 0  # nothing on disk to count


def test_path_keyed_events_join_the_generation_by_path() -> None:
    tracker = job()
    feed(tracker, [ev("save_start", T, step=None, path="ckpt/j/epoch=1.ckpt")], T)
    tracker.observe(DURABLE, [Found("epoch=1.ckpt", None, COMMITTED, T, T + 2, T + 2, 1, 1)], T + 2)
    assert hist(tracker, "total").count == 0  # joined: waiting for the events
    feed(tracker, [ev("committed", T + 2, step=None, path="ckpt/j/epoch=1.ckpt")], T + 3)
    assert hist(tracker, "total").count == 1


def test_history_events_set_gauges_only() -> None:
    tracker = job()
    old = [
        ev(e.event, e.ts, e.step, e.rank, history=True)
        for e in save(0, T - 100, T - 99, T - 98, T - 90, T - 89)
    ]
    feed(tracker, old, T)
    assert dict(tracker.state().last_phases)["total"] == 11.0
    assert hist(tracker, "total").count == 0


def test_restores_from_jobs_and_drills() -> None:
    tracker = job()
    feed(tracker, [ev("restore_start", T, rank=0), ev("restore_start", T, rank=1)], T)
    feed(tracker, [ev("restore_done", T + 30, rank=0)], T + 30)
    assert tracker.state().restores == 0  # rank 1 still loading
    feed(tracker, [ev("restore_done", T + 42, rank=1)], T + 42)
    state = tracker.state()
    assert (state.restores, state.restore_failures) == (1, 0)
    assert (state.restore_last_success, state.restore_last_duration) == (T + 42, 42.0)
    feed(tracker,
        [ev("restore_start", T + 100, host="drill"),
         ev("restore_failed", T + 103, host="drill", error="truncated_shard")],
        T + 103,
    )  # fmt: skip
    state = tracker.state()
    assert (state.restores, state.restore_failures) == (2, 1)
    assert state.restore_last_success == T + 42 and state.restore_last_duration == 3.0


def test_a_two_tier_save_ends_at_its_durable_commit() -> None:
    from checkpoint_exporter.model import STAGING

    tracker = JobTracker(
        "j", (WatchedPath(DURABLE, "/filer/j"), WatchedPath(STAGING, "/nvme/j")), Policy(deadline=5)
    )
    tracker.observe(DURABLE, [], T)
    tracker.observe(STAGING, [], T)
    feed(tracker, save(0, T, T + 1, T + 1, T + 2, T + 2), T + 2)  # on staging in 2 s
    assert hist(tracker, "total").count == 0  # not durable yet
    tracker.observe(DURABLE, [Found("step-10", 10, COMMITTED, T + 3, T + 9, T + 9, 10, 1)], T + 9)
    tracker.tick(T + 10)
    assert hist(tracker, "total").sum == 9.0  # save start to the durable commit
    assert hist(tracker, "pause").sum == 1.0 and tracker.state().deadline_misses == 1
    assert tracker.state().recent_saves[-1].outcome == "late"


def test_a_save_waiting_for_its_durable_commit_sets_no_timer_in_the_past() -> None:
    """Committed to staging, not yet durable: the job is next due at the timeline's expiry (or
    when the disk shows the commit), never again and again at a settle time long gone -- the
    core would wake for it every 10 ms for as long as the drain takes."""
    from checkpoint_exporter.model import STAGING

    tracker = JobTracker(
        "j", (WatchedPath(DURABLE, "/filer/j"), WatchedPath(STAGING, "/nvme/j")), Policy(deadline=5)
    )
    tracker.observe(DURABLE, [], T)
    tracker.observe(STAGING, [], T)
    feed(tracker, save(0, T, T + 1, T + 1, T + 2, T + 2), T + 2)
    for now in (T + 30, T + 300):
        tracker.tick(now)
        due = tracker.next_due(now)
        assert due is not None and due > now, (now, due)
    tracker.observe(
        DURABLE, [Found("step-10", 10, COMMITTED, T + 3, T + 400, T + 400, 10, 1)], T + 400
    )
    tracker.tick(T + 401)
    assert hist(tracker, "total").sum == 400.0  # the drain ended it, as before


# --- hostile events: bounded state, sane numbers ---------------------------------------------


def test_durations_are_finite_whatever_the_timestamps() -> None:
    """-1e308 and 1e308 are finite, their difference is not."""
    phases = phases_of({"save_start": -1e308, "resume": 1e308, "committed": 1e308})
    assert phases == {"pause": MAX_SECONDS, "total": MAX_SECONDS}
    tracker = job()
    feed(tracker, [ev("save_start", -1e308), ev("committed", T + 5)], T + 5)
    feed(tracker, [ev("save_start", -1e308, step=11), ev("committed", T + 6, step=11)], T + 6)
    total = hist(tracker, "total")
    assert total.count == 2 and math.isfinite(total.sum) and total.sum == 2 * MAX_SECONDS


def test_an_event_from_the_future_is_refused_and_counted() -> None:
    tracker = job()
    year_9999 = 253402300799.0
    feed(tracker, [ev("restore_start", T), ev("restore_done", year_9999)], T + 1)
    feed(tracker, [ev("save_start", T + FUTURE_SLACK + 60, step=5)], T + 1)
    state = tracker.state()
    assert state.restore_last_success is None  # would have masked the drill-overdue alert
    assert tracker.clocks.dropped == {"future": 2}
    feed(tracker, [ev("restore_done", T + 30)], T + 30)  # the real end still counts
    assert tracker.state().restore_last_success == T + 30


def test_an_event_before_its_own_start_is_refused() -> None:
    tracker = job()
    feed(tracker, [ev("save_start", T), ev("committed", T - 3600)], T, settle=False)
    feed(tracker, [ev("restore_start", T, host="d"), ev("restore_done", T - 50, host="d")], T)
    assert tracker.clocks.dropped == {"before_start": 2}
    feed(tracker, [ev("committed", T - 0.5)], T + 1)  # a clock step under START_SLACK: 0 s
    assert dict(tracker.state().last_phases) == {"total": 0.0}
    # A start reported after its rank's later points, dated after them, is refused too.
    clocks = Clocks()
    clocks.add([ev("committed", T, step=9), ev("save_start", T + 100, step=9)], T + 100)
    assert clocks.dropped == {"before_start": 1}


def test_open_saves_restores_ranks_and_errors_are_capped() -> None:
    clocks = Clocks()
    flood = [ev("save_start", T, step=step) for step in range(10_000)]
    clocks.add(flood, T)
    assert len(clocks.saves) == MAX_OPEN_SAVES
    assert min(key[1] for key in clocks.saves) == 10_000 - MAX_OPEN_SAVES  # the oldest went
    restores = [ev("restore_start", T, step=step, host=f"h{step}") for step in range(1000)]
    clocks.add(restores, T)
    assert len(clocks.restores) == MAX_OPEN_RESTORES
    ranks = [ev("save_start", T, step=1, rank=rank) for rank in range(1000)]
    failures = [ev("save_failed", T, step=1, rank=0, error=f"e{n}") for n in range(1000)]
    clocks.add(ranks + failures, T)
    timeline = clocks.saves[("step", 1)]
    assert len(timeline.ranks) == MAX_RANKS
    assert timeline.errors == [f"e{n}" for n in range(1000 - MAX_ERRORS, 1000)]
    assert clocks.dropped == {
        "open_saves_cap": 10_000 - MAX_OPEN_SAVES + 1,  # step 1 evicted one more
        "open_restores_cap": 1000 - MAX_OPEN_RESTORES,
        "ranks_cap": 1000 - MAX_RANKS,
    }


def test_a_shared_counter_collects_every_jobs_drops() -> None:
    shared: Counter[str] = Counter({"future": 1})
    clocks = Clocks(dropped=shared)
    clocks.add([ev("save_start", T + 1e6)], T)
    assert shared == {"future": 2}


def test_a_finished_save_outlives_a_flood_of_starts_in_the_same_batch() -> None:
    """The cap gives up saves still waiting for a rank first: a job's (or a bug's) stream of
    starts that never end does not push out a save that ended, before it is accounted."""
    tracker = job()
    flood = [ev("save_start", T + 5, step=step) for step in range(100, 100 + 5 * MAX_OPEN_SAVES)]
    feed(tracker, save(0, T, T + 1, T + 2, T + 3, T + 4, step=7) + flood, T + 5)
    assert hist(tracker, "total").count == 1 and dict(tracker.state().last_phases)["total"] == 4
    assert tracker.clocks.dropped == {"open_saves_cap": 4 * MAX_OPEN_SAVES + 1}


def test_a_save_under_way_outlives_a_flood_of_bare_starts() -> None:
    """The flood lands between a save's write and its commit (same batch, sorted by time)."""
    tracker = job()
    flood = [ev("save_start", T + 3, step=step) for step in range(100, 100 + 3 * MAX_OPEN_SAVES)]
    events = save(0, T, T + 1, T + 2, T + 2.5, T + 4, step=7)
    feed(tracker, events[:4] + flood + events[4:], T + 5)
    assert hist(tracker, "total").count == 1 and dict(tracker.state().last_phases)["total"] == 4


def test_a_save_is_in_progress_on_this_node_from_its_first_start_to_its_last_rank_s_end() -> None:
    """checkpoint_local_saves_in_progress: the state timeline's per-node row, from the spool."""
    tracker = job()
    assert tracker.state().local_saves_in_progress == 0
    feed(tracker, [ev("save_start", T + 1, rank=0), ev("save_start", T + 1, rank=1)], T + 2)
    assert tracker.state().local_saves_in_progress == 1
    feed(tracker, save(0, T + 1, T + 2, T + 2, T + 3, T + 4)[1:], T + 5)
    assert tracker.state().local_saves_in_progress == 1  # rank 1 still writing
    feed(tracker, save(1, T + 1, T + 2, T + 2, T + 3, T + 6)[1:], T + 7)
    assert tracker.state().local_saves_in_progress == 0
