"""The generation lifecycle: history vs counted events, deadlines, aborts, deletion, validity."""

from __future__ import annotations

from checkpoint_exporter.config import Config, Policy
from checkpoint_exporter.core.jobs import Tracker
from checkpoint_exporter.core.tracker import JobTracker
from checkpoint_exporter.model import ABORTED, COMMITTED, DURABLE, STAGING, WRITING, WatchedPath
from checkpoint_exporter.sources.layouts.base import DCP, Check, Found
from checkpoint_exporter.sources.validate import Verdict

T = 1_800_000_000.0
CHECK = (Check(DCP, "x"),)


def job(deadline: float = 60, abort_after: float | None = None) -> JobTracker:
    policy = Policy(deadline=deadline, abort_after=abort_after)
    return JobTracker("j", (WatchedPath(DURABLE, "/x"),), policy)


def gen(gen_id: str, state: str, start: float, commit: float | None = None, **kw) -> Found:
    last = commit if commit is not None else start
    return Found(gen_id, kw.pop("step", None), state, start, last, commit, kw.pop("size", 10),
                 1, kw.pop("checks", CHECK), **kw)  # fmt: skip


def by_id(tracker: JobTracker) -> dict:
    return {g.id: g for g in tracker.state().generations}


def test_history_sets_gauges_never_counters() -> None:
    tracker = job()
    requests = tracker.observe(
        DURABLE,
        [
            gen("old", COMMITTED, T, T + 500),  # way over the deadline, but history
            gen("stale", WRITING, T + 600),  # abandoned long before the exporter started
            gen("live", WRITING, T + 9990),  # in flight right now
        ],
        now=T + 10_000,
    ).requests
    state = tracker.state()
    assert (state.saves_committed, state.saves_aborted, state.deadline_misses) == (0, 0, 0)
    assert {g.id: g.state for g in state.generations} == {
        "old": COMMITTED, "stale": ABORTED, "live": WRITING,
    }  # fmt: skip
    assert [r.generation for r in requests] == ["old"]
    # The save found in flight is counted when it ends.
    tracker.observe(
        DURABLE,
        [gen("old", COMMITTED, T, T + 500), gen("live", COMMITTED, T + 9990, T + 10_010)],
        T + 10_011,
    )
    assert tracker.state().saves_committed == 1


def test_commit_counts_duration_and_deadline_misses() -> None:
    tracker = job(deadline=60)
    tracker.observe(DURABLE, [], T)
    tracker.observe(DURABLE, [gen("a", WRITING, T + 1)], T + 2)
    tracker.observe(DURABLE, [gen("a", COMMITTED, T + 1, T + 31)], T + 32)
    tracker.observe(
        DURABLE,
        [gen("a", COMMITTED, T + 1, T + 31), gen("b", COMMITTED, T + 100, T + 190)],
        T + 191,
    )
    state = tracker.state()
    assert (state.saves_committed, state.deadline_misses) == (2, 1)
    histogram = dict(state.save_duration)["total"]
    assert histogram.count == 2 and histogram.sum == 30 + 90
    assert 60 in histogram.bounds  # the deadline is a bucket boundary
    cumulative = dict(histogram.cumulative())
    assert cumulative[60] == 1 and cumulative[float("inf")] == 2


def test_no_progress_for_abort_after_aborts_once() -> None:
    tracker = job(deadline=30, abort_after=30)
    tracker.observe(DURABLE, [], T)
    tracker.observe(DURABLE, [gen("a", WRITING, T, size=1)], T + 1)
    tracker.observe(DURABLE, [gen("a", WRITING, T, size=2)], T + 20)  # progress resets the timer
    tracker.tick(T + 45)
    assert by_id(tracker)["a"].state == WRITING
    tracker.tick(T + 51)
    tracker.tick(T + 80)
    assert by_id(tracker)["a"].state == ABORTED and tracker.state().saves_aborted == 1
    # A commit long after it was given up still counts as a commit, and as a deadline miss.
    tracker.observe(DURABLE, [gen("a", COMMITTED, T, T + 90)], T + 91)
    state = tracker.state()
    assert (state.saves_committed, state.saves_aborted, state.deadline_misses) == (1, 1, 1)


def test_a_slow_commit_is_late_never_aborted() -> None:
    """The demo's slow-commit job: the shards are written, then nothing moves for longer than
    the 5 s deadline until the marker lands at 7 s. One deadline miss; never an abort (it was
    counted aborted and then late: 12 / 4 / 4 committed / aborted / late)."""
    tracker = job(deadline=5)
    tracker.observe(DURABLE, [], T)
    tracker.observe(DURABLE, [gen("a", WRITING, T, size=10)], T + 0.5)
    for second in range(1, 8):
        tracker.tick(T + second)  # the old abort timer would have fired at T + 5.5
        assert by_id(tracker)["a"].state == WRITING
    tracker.observe(DURABLE, [gen("a", COMMITTED, T, T + 7)], T + 7.2)
    state = tracker.state()
    assert (state.saves_committed, state.saves_aborted, state.deadline_misses) == (1, 0, 1)
    assert [r.outcome for r in state.recent_saves] == ["late"]


def test_abort_after_defaults_to_twice_the_deadline_and_at_least_ten_minutes() -> None:
    assert Policy(deadline=60).abort_seconds == 600
    assert Policy(deadline=900).abort_seconds == 1800
    assert Policy(deadline=60, abort_after=120).abort_seconds == 120


def test_abort_timer_uses_the_local_clock_not_skewed_mtimes() -> None:
    tracker = job(deadline=30)
    tracker.observe(DURABLE, [], T)
    skewed = T - 3600  # the writer's clock runs an hour behind
    tracker.observe(DURABLE, [gen("a", WRITING, skewed, size=1)], T + 1)
    tracker.observe(DURABLE, [gen("a", WRITING, skewed, size=5)], T + 10)
    tracker.tick(T + 11)
    assert by_id(tracker)["a"].state == WRITING
    tracker.observe(
        DURABLE, [gen("a", COMMITTED, skewed, skewed - 5)], T + 12
    )  # commit "before" start
    assert dict(tracker.state().save_duration)["total"].sum == 0  # never negative


def test_writer_abort_sign_and_deletion() -> None:
    tracker = job()
    tracker.observe(DURABLE, [], T)
    tracker.observe(DURABLE, [gen("a", WRITING, T)], T + 1)
    tracker.observe(DURABLE, [gen("a", ABORTED, T, reason="superseded")], T + 2)
    assert tracker.state().saves_aborted == 1
    tracker.observe(DURABLE, [], T + 3)  # retention removed it
    assert by_id(tracker) == {}


def test_validation_verdicts_and_revalidation_on_change() -> None:
    tracker = job()
    tracker.observe(DURABLE, [], T)
    (request,) = tracker.observe(DURABLE, [gen("a", COMMITTED, T, T + 5)], T + 6).requests
    tracker.submitted(request)
    assert (
        tracker.observe(DURABLE, [gen("a", COMMITTED, T, T + 5)], T + 7).requests == []
    )  # pending
    tracker.apply_verdict(request, Verdict(True))
    assert by_id(tracker)["a"].valid is True
    # A shard is truncated later: the signature changes, so it is validated again.
    (again,) = tracker.observe(DURABLE, [gen("a", COMMITTED, T, T + 5, size=3)], T + 8).requests
    tracker.apply_verdict(request, Verdict(False, "truncated_shard"))  # stale verdict: ignored
    assert by_id(tracker)["a"].valid is True
    tracker.apply_verdict(again, Verdict(False, "truncated_shard"))
    assert by_id(tracker)["a"].valid is False
    assert dict(tracker.state().validation_failures) == {"truncated_shard": 1}


def test_history_validation_failure_sets_the_gauge_only() -> None:
    tracker = job()
    (request,) = tracker.observe(DURABLE, [gen("a", COMMITTED, T, T + 5)], T + 100).requests
    tracker.apply_verdict(request, Verdict(False, "missing_shard"))
    assert by_id(tracker)["a"].valid is False
    assert tracker.state().validation_failures == ()


def test_generation_without_checks_is_valid_and_layout_invalid_is_counted() -> None:
    tracker = job()
    tracker.observe(DURABLE, [], T)
    tracker.observe(DURABLE, [gen("plain", COMMITTED, T, T + 1, checks=())], T + 2)
    bad = gen("bad", COMMITTED, T, T + 1, checks=(), invalid=True, reason="bad_metadata")
    tracker.observe(DURABLE, [gen("plain", COMMITTED, T, T + 1, checks=()), bad], T + 3)
    gens = by_id(tracker)
    assert gens["plain"].valid is True and gens["bad"].valid is False
    assert dict(tracker.state().validation_failures) == {"bad_metadata": 1}


def test_rewritten_in_place_goes_back_to_writing() -> None:
    tracker = job()
    tracker.observe(DURABLE, [], T)
    tracker.observe(DURABLE, [gen("latest", COMMITTED, T, T + 1)], T + 2)
    tracker.observe(DURABLE, [gen("latest", WRITING, T + 100)], T + 101)
    assert by_id(tracker)["latest"].state == WRITING and by_id(tracker)["latest"].valid is None
    tracker.observe(DURABLE, [gen("latest", COMMITTED, T + 100, T + 110)], T + 111)
    assert tracker.state().saves_committed == 2


def test_staging_tier_is_tracked_but_not_counted() -> None:
    tracker = JobTracker("j", (WatchedPath(DURABLE, "/d"), WatchedPath(STAGING, "/s")), Policy())
    tracker.observe(STAGING, [], T)
    tracker.observe(STAGING, [gen("s1", COMMITTED, T, T + 1)], T + 2)
    assert tracker.state().saves_committed == 0
    assert by_id(tracker)["s1"].tier == STAGING


def test_hot_directories_are_the_saves_in_progress() -> None:
    tracker = job()
    tracker.observe(DURABLE, [gen("w", WRITING, T), gen("c", COMMITTED, T, T + 1)], T + 2)
    assert tracker.hot_directories(DURABLE) == ["w"] and tracker.has_saves_in_progress()


def test_an_unchanged_scan_keeps_the_published_state() -> None:
    """An idle poll hands over the very Found objects of the last parse: the job's state (and
    so its rendered series) is not rebuilt; a fresh parse, a new generation or a deletion is."""
    tracker = job()
    found = [gen("a", COMMITTED, T, T + 5), gen("b", COMMITTED, T + 100, T + 105)]
    tracker.observe(DURABLE, found, T + 200)
    state = tracker.state()
    requests = tracker.observe(DURABLE, found, T + 205).requests
    assert [r.generation for r in requests] == ["b", "a"]  # still awaiting their verdicts
    assert tracker.state() is state
    tracker.observe(DURABLE, [found[0], gen("b", COMMITTED, T + 100, T + 105)], T + 210)
    assert tracker.state() is not state  # re-parsed (the listing changed): rebuilt
    state = tracker.state()
    tracker.observe(DURABLE, found[:1], T + 215)
    assert tracker.state() is not state and [g.id for g in tracker.state().generations] == ["a"]


def test_the_version_moves_exactly_when_the_state_does() -> None:
    tracker = job()
    found = [gen("a", COMMITTED, T, T + 5)]
    tracker.observe(DURABLE, found, T + 6)
    first = tracker.state()
    assert first.version == tracker.version > 0
    tracker.observe(DURABLE, found, T + 7)  # the same listing: nothing moved
    assert tracker.state() is first
    tracker.observe(DURABLE, [*found, gen("b", WRITING, T + 8)], T + 9)
    assert tracker.state() is not first and tracker.state().version > first.version


def test_next_due_is_when_tick_has_work() -> None:
    tracker = job(deadline=60)
    tracker.observe(DURABLE, [], T)
    assert tracker.next_due(T) is None  # idle: no timer at all
    tracker.observe(DURABLE, [gen("a", WRITING, T + 1)], T + 2)
    due = tracker.next_due(T + 2)
    assert due is not None and T + 602 < due <= T + 602.1  # its abort_after, just past
    tracker.tick(T + 601)
    assert by_id(tracker)["a"].state == WRITING
    tracker.tick(due)
    assert by_id(tracker)["a"].state == ABORTED and tracker.next_due(due) is None


def test_a_publish_rebuilds_only_the_jobs_that_changed() -> None:
    trackers = Tracker(Config())
    for name in ("a", "b"):
        trackers.add(JobTracker(name, (WatchedPath(DURABLE, f"/{name}"),), Policy()))
    before = trackers.publish()
    trackers.jobs["a"].observe(DURABLE, [gen("x", COMMITTED, T, T + 1)], T + 2)
    trackers.jobs["b"].observe(DURABLE, [gen("y", COMMITTED, T, T + 1)], T + 2)
    after = trackers.publish(changed={"a"})  # b changed too, but nobody said so
    assert [j.name for j in after.jobs] == ["a", "b"]
    assert after.jobs[0] is not before.jobs[0] and after.jobs[1] is before.jobs[1]
    assert trackers.publish(changed={"b"}).jobs[1].generations[0].id == "y"
