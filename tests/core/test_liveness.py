"""A job's life as the core sees it (first seen, last sign of life, finished), and saves aborted
only on evidence: their ranks said so, a newer save committed over them, or nothing moved for
abort_after. Pure core: fake clocks, no I/O."""

from __future__ import annotations

from dataclasses import replace

import pytest

from checkpoint_exporter.config import Policy
from checkpoint_exporter.core.tracker import FINISHED_GRACE, JobTracker
from checkpoint_exporter.model import ABORTED, COMMITTED, DURABLE, WRITING, WatchedPath
from checkpoint_exporter.sources.layouts.base import DCP, Check, Found
from checkpoint_exporter.sources.spool import Event
from checkpoint_exporter.sources.validate import Verdict

T = 1_800_000_000.0


def job(**policy: object) -> JobTracker:
    return JobTracker("j", (WatchedPath(DURABLE, "/x"),), Policy(**policy), first_seen=T)


def ev(event: str, ts: float, step: int | None = None, rank: int = 0, **kw: object) -> Event:
    return Event(
        ts, event, "j", step, rank, 1, "n1", kw.get("path"), None, kw.get("error"),  # type: ignore[arg-type]
        bool(kw.get("history", False)), bool(kw.get("drill", False)),
    )  # fmt: skip


def dcp(gen_id: str, state: str, start: float, last: float, step: int | None = None) -> Found:
    commit = last if state == COMMITTED else None
    return Found(gen_id, step, state, start, last, commit, 10, 1, (Check(DCP, gen_id),))


def states(tracker: JobTracker) -> dict[str, str]:
    return {g.id: g.state for g in tracker.state().generations}


# --- liveness ------------------------------------------------------------------------------


def test_a_new_job_has_a_first_seen_time_and_no_sign_of_life_yet() -> None:
    state = job().state()
    assert (state.first_seen, state.alive_at, state.finished) == (T, None, False)


def test_heartbeats_and_events_are_signs_of_life_never_later_than_now() -> None:
    tracker = job()
    tracker.apply_events([ev("heartbeat", T + 10)], T + 11)
    assert tracker.state().alive_at == T + 10
    tracker.apply_events([ev("save_start", T + 20, step=5)], T + 21)
    assert tracker.state().alive_at == T + 20
    # An event dated ahead of this node's clock (within the spool's slack) counts as now.
    tracker.apply_events([ev("heartbeat", T + 200)], T + 30)
    assert tracker.state().alive_at == T + 30
    tracker.apply_events([ev("heartbeat", T + 25)], T + 40)  # older than what is known
    assert tracker.state().alive_at == T + 30


def test_a_write_in_the_tree_is_a_sign_of_life_history_included() -> None:
    tracker = job()
    tracker.observe(DURABLE, [dcp("step-1", COMMITTED, T - 900, T - 800, 1)], T)
    assert tracker.state().alive_at == T - 800  # the job last wrote then
    tracker.observe(
        DURABLE,
        [dcp("step-1", COMMITTED, T - 900, T - 800, 1), dcp("step-2", WRITING, T + 5, T + 6, 2)],
        T + 7,
    )
    assert tracker.state().alive_at == T + 6
    # A file dated a year ahead is a write now, not a sign of life for the year to come.
    future = replace(dcp("step-2", WRITING, T + 5, T + 365 * 86400, 2), bytes=20)
    tracker.observe(DURABLE, [dcp("step-1", COMMITTED, T - 900, T - 800, 1), future], T + 8)
    assert tracker.state().alive_at == T + 8


def test_a_cleanup_in_a_dead_jobs_tree_is_no_sign_of_life() -> None:
    """A cron removing old generations of a job that died three days ago moves directory
    mtimes, not the job: it stays as silent as it was (it used to wake up and page TooOld)."""
    tracker = job()
    old = dcp("step-1", COMMITTED, T - 3 * 86400, T - 3 * 86400 + 60, 1)
    tracker.observe(DURABLE, [old], T)
    assert tracker.state().alive_at == T - 3 * 86400 + 60
    emptied = replace(old, files=0, bytes=0, last_write_time=T + 5)  # rmtree under way
    tracker.observe(DURABLE, [emptied], T + 6)
    assert tracker.state().alive_at == T - 3 * 86400 + 60


def test_finished_holds_while_other_ranks_wind_down_and_ends_when_the_job_runs_again() -> None:
    tracker = job()
    tracker.apply_events([ev("heartbeat", T), ev("finished", T + 100)], T + 100)
    assert tracker.state().finished
    # rank 1 heartbeats once more while its process exits: still finished.
    tracker.apply_events([ev("heartbeat", T + 100 + FINISHED_GRACE / 2, rank=1)], T + 160)
    assert tracker.state().finished
    # Resubmitted: its heartbeats go on well past the grace.
    later = T + 100 + 2 * FINISHED_GRACE
    tracker.apply_events([ev("heartbeat", later)], later)
    assert not tracker.state().finished


def test_a_save_or_a_restart_after_finished_means_it_runs_again() -> None:
    for event in ("save_start", "restore_start"):
        tracker = job()
        tracker.apply_events([ev("finished", T)], T)
        tracker.apply_events([ev(event, T + 1, step=9)], T + 2)
        assert not tracker.state().finished, event


def test_a_new_save_on_disk_after_finished_means_it_runs_again() -> None:
    tracker = job()
    tracker.observe(DURABLE, [], T)
    tracker.apply_events([ev("finished", T + 10)], T + 10)
    tracker.observe(DURABLE, [dcp("step-2", WRITING, T + 50, T + 51, 2)], T + 52)
    assert not tracker.state().finished


def test_a_drill_is_no_sign_of_life_and_does_not_end_finished() -> None:
    tracker = job()
    tracker.apply_events([ev("finished", T)], T)
    drill = [ev("restore_start", T + 500, step=1, drill=True)]
    drill.append(ev("restore_done", T + 510, step=1, drill=True))
    tracker.apply_events(drill, T + 520)
    state = tracker.state()
    assert state.finished and state.alive_at == T
    assert (state.restores, state.restore_drills, state.restore_drill_failures) == (1, 1, 0)


def test_the_config_can_say_a_job_finished() -> None:
    tracker = job(finished=True)
    tracker.apply_events([ev("heartbeat", T + 1000)], T + 1000)
    assert tracker.state().finished


def test_drills_and_training_restores_are_counted_apart() -> None:
    tracker = job()
    events = [
        ev("restore_start", T, step=1, drill=True),
        ev("restore_failed", T + 1, step=1, drill=True, error="OSError: EIO"),
        ev("restore_start", T + 2, step=1),  # the training job, same step, same host
        ev("restore_failed", T + 3, step=1, error="KeyError: 'model'"),
    ]
    tracker.apply_events(events, T + 10)
    state = tracker.state()
    assert (state.restores, state.restore_failures) == (2, 2)
    assert (state.restore_drills, state.restore_drill_failures) == (1, 1)
    assert [r.drill for r in state.recent_restores] == [True, False]


# --- aborted only on evidence --------------------------------------------------------------


def test_ranks_that_report_save_failed_abort_the_save_at_once_and_once() -> None:
    tracker = job(deadline=60)
    tracker.observe(DURABLE, [], T)
    tracker.apply_events([ev("save_start", T + 1, step=7)], T + 1)
    tracker.observe(DURABLE, [dcp("step-7", WRITING, T + 1, T + 2, 7)], T + 3)
    tracker.apply_events([ev("save_failed", T + 4, step=7, error="OSError: ENOSPC")], T + 4)
    tracker.tick(T + 5)  # its timeline settles
    assert states(tracker) == {"step-7": ABORTED}
    assert tracker.state().saves_aborted == 1
    assert [r.outcome for r in tracker.state().recent_saves] == ["aborted"]
    tracker.tick(T + 10_000)
    assert tracker.state().saves_aborted == 1


def test_a_save_that_failed_before_writing_anything_is_one_abort() -> None:
    tracker = job(deadline=60)
    tracker.observe(DURABLE, [], T)
    tracker.apply_events([ev("save_start", T + 1, step=8), ev("save_failed", T + 2, step=8)], T + 2)
    tracker.tick(T + 3)
    assert tracker.state().saves_aborted == 1
    # A partial directory turns up afterwards and never moves: not counted a second time.
    tracker.observe(DURABLE, [dcp("step-8", WRITING, T + 1, T + 2, 8)], T + 4)
    tracker.tick(T + 4 + 700)
    assert states(tracker) == {"step-8": ABORTED} and tracker.state().saves_aborted == 1


def test_a_newer_commit_aborts_a_save_that_stood_still_since_before_it_started() -> None:
    tracker = job(deadline=60)
    tracker.observe(DURABLE, [], T)
    dead = dcp("step-1", WRITING, T, T + 5, 1)  # a rank was killed mid-save
    tracker.observe(DURABLE, [dead], T + 6)
    tracker.observe(DURABLE, [dead, dcp("step-2", WRITING, T + 100, T + 101, 2)], T + 102)
    assert states(tracker)["step-1"] == WRITING  # abort_after (600 s) has not passed
    tracker.observe(DURABLE, [dead, dcp("step-2", COMMITTED, T + 100, T + 130, 2)], T + 131)
    assert states(tracker) == {"step-1": ABORTED, "step-2": COMMITTED}
    state = tracker.state()
    assert (state.saves_committed, state.saves_aborted) == (1, 1)


def test_overlapping_saves_still_writing_are_not_superseded() -> None:
    """Async saves in flight together (a backlog): the older still writes after the newer
    started, so the newer's commit says nothing of it."""
    tracker = job(deadline=60)
    tracker.observe(DURABLE, [], T)
    older = dcp("step-1", WRITING, T, T + 120, 1)
    tracker.observe(DURABLE, [older, dcp("step-2", COMMITTED, T + 100, T + 130, 2)], T + 131)
    assert states(tracker)["step-1"] == WRITING and tracker.state().saves_aborted == 0


# --- time from the tenant is bounded ([tenants] item 7) -------------------------------------

YEAR = 365 * 86400.0


def test_a_file_dated_a_year_ahead_cannot_pin_the_newest_generation() -> None:
    """`touch -d '+365 days'` on one generation's marker: it is published as committed when the
    exporter saw it, so the next save (a higher step, committed later) is the newest, and its
    own verdict shows."""
    tracker = job()
    tracker.observe(DURABLE, [], T)
    future = dcp("step-1", COMMITTED, T - 10, T + YEAR, 1)
    tracker.observe(DURABLE, [future], T + 1)
    (published,) = tracker.state().generations
    assert published.commit_time == T + 1 and published.last_write_time == T + 1
    later = dcp("step-2", COMMITTED, T + 50, T + 60, 2)
    tracker.observe(DURABLE, [future, later], T + 61)
    state = tracker.state()
    newest = max((g for g in state.generations), key=lambda g: g.commit_time or 0)
    assert newest.id == "step-2"
    from checkpoint_exporter.model import newest_committed

    assert newest_committed(state).id == "step-2"


def test_the_newest_commit_is_newest_whatever_the_steps() -> None:
    """A job rolled back after a loss spike saves step 4100 while step 5000 stays on disk: the
    newest checkpoint is the one it committed last, not the higher step committed an hour ago
    (which made a healthy job page as too old)."""
    from checkpoint_exporter.model import newest_committed

    tracker = job()
    tracker.observe(DURABLE, [], T)
    gens = [dcp("step-5000", COMMITTED, T - 3700, T - 3600, 5000)]
    gens.append(dcp("step-4100", COMMITTED, T + 1, T + 20, 4100))
    tracker.observe(DURABLE, gens, T + 21)
    assert newest_committed(tracker.state()).id == "step-4100"


def test_the_skew_gauge_holds_a_far_off_date_long_enough_for_its_alert() -> None:
    """One file a year ahead, then sixteen ordinary changes: the gauge keeps the year for an
    hour (the alert needs 15 minutes), while times are moved onto the local clock by the
    storage's real offset, never by that one file's."""
    from checkpoint_exporter.core.tracker import SKEW_HOLD

    tracker = job()
    tracker.observe(DURABLE, [], T)
    now = T + 1
    tracker.observe(DURABLE, [dcp("step-1", COMMITTED, T, T + YEAR, 1)], now)
    gens = [dcp("step-1", COMMITTED, T, T + YEAR, 1)]
    for step in range(2, 20):
        now += 10
        gens.append(dcp(f"step-{step}", COMMITTED, now - 1, now - 0.5, step))
        tracker.observe(DURABLE, list(gens), now)
    assert tracker.state().storage_clock_skew > YEAR - 10  # held
    assert tracker.local_time(T + 500) == T + 500  # the real offset (-0.5 s) is latency
    now += SKEW_HOLD + 1
    gens.append(dcp("step-99", COMMITTED, now - 1, now - 0.5, 99))
    tracker.observe(DURABLE, list(gens), now)
    assert abs(tracker.state().storage_clock_skew) < 1  # an hour later: the storage's own


def test_a_newer_commit_waits_for_an_older_saves_verdict_under_way() -> None:
    """A single-file save still being checked (the parser busy with another tenant's file) is
    not aborted because a newer one committed meanwhile: not judged is not aborted."""
    from checkpoint_exporter.sources.layouts.base import ZIP

    tracker = job(deadline=60, settle=5)
    tracker.observe(DURABLE, [], T)

    def single(name: str, step: int, mtime: float) -> Found:
        return Found(name, step, WRITING, mtime, mtime, None, 500, 1, (Check(ZIP, name),),
                     settles=True)  # fmt: skip

    older = single("step-1.ckpt", 1, T + 1)
    tracker.observe(DURABLE, [older], T + 1)
    (request,) = tracker.observe(DURABLE, [older], T + 7).requests
    tracker.submitted(request)  # its check is queued
    newer = dcp("step-2", COMMITTED, T + 50, T + 60, 2)
    tracker.observe(DURABLE, [older, newer], T + 61)
    assert states(tracker)["step-1.ckpt"] == WRITING


# --- a generation that loses files is never a new commit ([writers] item 1) ----------------


@pytest.mark.parametrize("order", ["marker_first", "shards_first", "interleaved"])
@pytest.mark.parametrize("pause", [0.5, 8.0])  # between two removals: within, and past, settle
@pytest.mark.parametrize("marker", [True, False])  # DCP's .metadata; a tag without one
def test_a_generation_deleted_file_by_file_is_never_a_new_save(
    order: str, pause: float, marker: bool
) -> None:
    """retention's rmtree takes a committed generation's five files in any order, slowly, read
    twice between removals: saves_committed stays at the one real save (DeepSpeed with keep-2
    counted 6 commits for 4 saves; copies of DCP checkpoints deleted slowly raised it twice)."""
    from checkpoint_exporter.sources.layouts.base import ZIP

    tracker = job(deadline=60, settle=5)
    tracker.observe(DURABLE, [], T)
    names = ["__0_0.distcp", "__1_0.distcp", "__2_0.distcp", "__3_0.distcp"]
    names = [*names, ".metadata"] if marker else [*names, "mp_rank_00_model_states.pt"]
    if order == "marker_first":
        names = names[::-1]
    elif order == "interleaved":
        names = [names[2], names[4], names[0], names[3], names[1]]
    sizes = {name: 100 for name in names}

    def found(now: float) -> Found:
        files = len(sizes)
        state = COMMITTED if marker and ".metadata" in sizes else WRITING
        commit = T + 10 if state == COMMITTED else None
        checks = (Check(ZIP, "mp_rank_00_model_states.pt"),) if not marker else ()
        return Found("step-1", 1, state, T, T + 10, commit, 100 * files, files, checks,
                     settles=not marker)  # fmt: skip

    now = T + 10
    tracker.observe(DURABLE, [found(now)], now)
    if not marker:  # judged once still: committed when its check passes
        now += 6
        (request,) = tracker.observe(DURABLE, [found(now)], now).requests
        tracker.submitted(request)
        tracker.apply_verdict(request, Verdict(True))
    assert tracker.state().saves_committed == 1
    for name in names[:-1]:
        del sizes[name]
        for _ in range(2):
            now += pause / 2
            tracker.tick(now)
            for request in tracker.observe(DURABLE, [found(now)], now).requests:
                tracker.submitted(request)
                tracker.apply_verdict(request, Verdict(False, "missing_shard"))
            tracker.tick(now)
    tracker.observe(DURABLE, [], now + 1)  # the last file went with the directory
    state = tracker.state()
    assert (state.saves_committed, state.saves_aborted) == (1, 0), (order, pause, marker)
    assert state.deadline_misses + state.saves_within_deadline == 1


def test_heartbeats_and_finished_times_are_kept_for_the_rules() -> None:
    """The rules hold a job finished only while nobody saw it alive after it said so, and count
    a heartbeating job as running only while its heartbeats come: both times are exported."""
    tracker = job()
    tracker.apply_events([ev("heartbeat", T), ev("save_start", T + 5, step=1)], T + 5)
    state = tracker.state()
    assert (state.heartbeat_at, state.alive_at, state.finished_at) == (T, T + 5, None)
    tracker.apply_events([ev("finished", T + 9)], T + 9)
    assert tracker.state().finished_at == T + 9
    assert job(finished=True).state().finished_at == float("inf")


def test_a_second_abort_under_the_same_key_counts_again() -> None:
    """A fixed checkpoint_id (or a step saved again after a roll-back): after an abort and a
    commit under the key, the next abort under it is counted too (it was logged, not counted)."""
    tracker = job(deadline=60, abort_after=60)
    tracker.observe(DURABLE, [], T)
    tracker.apply_events([ev("save_start", T + 1, step=7), ev("save_failed", T + 2, step=7)], T + 2)
    tracker.tick(T + 3)
    assert tracker.state().saves_aborted == 1
    tracker.observe(DURABLE, [dcp("step-7", COMMITTED, T + 10, T + 20, 7)], T + 21)
    # Saved again under the same name: the marker goes, shards are rewritten, then nothing.
    tracker.observe(DURABLE, [dcp("step-7", WRITING, T + 100, T + 110, 7)], T + 111)
    tracker.tick(T + 111 + 61)
    state = tracker.state()
    assert states(tracker) == {"step-7": ABORTED}
    assert (state.saves_committed, state.saves_aborted) == (1, 2)
