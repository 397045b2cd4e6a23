"""The save ledger (core/ledger.py): one record per save, counted exactly once when it ends."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from checkpoint_exporter.core.ledger import COUNTED_KEYS, RECENT
from checkpoint_exporter.core.tracker import JobTracker
from checkpoint_exporter.model import COMMITTED, DURABLE, WRITING, Found, JobState

from .builders import T, ev, found, job


def _total(tracker) -> int:
    return _total_of(tracker.state())


def _total_of(state: JobState) -> int:
    return sum(dict(state.save_duration)["total"].counts)


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


# --- one entry per save: its lifecycle as a table ----------------------------------------------
# Each step of a history: ("writing" | "committed", step, at) the disk's read of the generation;
# ("events", step, at) its ranks' start and commit, read then; ("late", step, at) the ranks'
# events of the save the disk last showed committed under that step, dated as it was, read at
# ``at``; ("failed", step, at) its ranks' start and save_failed; ("tick", None, at). Times are
# seconds after T.

Action = tuple[str, int | None, float]


def _disk(verb: str, step: int, at: float) -> Found:
    if verb == "writing":
        return found(f"step_{step}", WRITING, T + at - 1, step=step, last=T + at)
    return found(f"step_{step}", COMMITTED, T + at - 20, T + at, step=step)


def _drive(history: list[Action]) -> JobTracker:
    tracker = job(deadline=60, abort_after=120)
    tracker.observe(DURABLE, [], T)
    listing: dict[int, Found] = {}
    for verb, step, at in history:
        if verb in ("writing", "committed"):
            listing[step] = _disk(verb, step, at)
            tracker.observe(DURABLE, list(listing.values()), T + at)
        elif verb in ("events", "failed"):
            end = "committed" if verb == "events" else "save_failed"
            events = [ev("save_start", T + at - 20, step), ev(end, T + at, step)]
            tracker.apply_events(events, T + at)
        elif verb == "late":
            saved = listing[step]
            assert saved.commit_time is not None
            events = [
                ev("save_start", saved.start_time, step),
                ev("committed", saved.commit_time, step),
            ]
            tracker.apply_events(events, T + at)
        tracker.tick(T + at + 1)  # settles what ended
    return tracker


def _saves(count: int, first: int) -> list[Action]:
    """``count`` saves seen from their events alone (an object store), 100 s apart."""
    return [("events", first + n, 100.0 * (first + n)) for n in range(count)]


@dataclass(frozen=True)
class Lifecycle:
    history: list[Action]
    committed: int = 0  # saves_committed
    aborted: int = 0  # saves_aborted
    counted: int = 0  # saves in the histograms (and so in the deadline counters)
    outcomes: tuple[str, ...] = ()  # of the recent saves, oldest first


BOUND = 100.0 * COUNTED_KEYS  # past the events-only saves of _saves(COUNTED_KEYS, 1)
LIFECYCLES = {
    "disk commit, then its events: counted once": Lifecycle(
        [("writing", 10, 5), ("committed", 10, 25), ("events", 10, 30)], 1, 0, 1, ("ok",)
    ),
    "events, then the disk's commit: counted once": Lifecycle(
        [("events", 10, 25), ("committed", 10, 30)], 1, 0, 1, ("ok",)
    ),
    "save_failed, then the disk's abort: one abort": Lifecycle(
        [("failed", 10, 25), ("writing", 10, 30), ("tick", None, 200)], 0, 1, 0, ("aborted",)
    ),
    "an abort, then a save under its key: both count, and its next abort": Lifecycle(
        [("failed", 7, 25), ("committed", 7, 60), ("writing", 7, 100), ("tick", None, 300)],
        committed=1,
        aborted=2,
        counted=1,
        outcomes=("aborted", "ok", "aborted"),
    ),
    "a step saved again under its name (disk only): each save counts": Lifecycle(
        [("committed", 10, 25), ("writing", 10, 200), ("committed", 10, 240)],
        committed=2,
        counted=2,
        outcomes=("ok", "ok"),
    ),
    "a step saved again after a roll-back, its events first each time: each save once": Lifecycle(
        [("events", 10, 25), ("committed", 10, 30), ("events", 10, 500), ("committed", 10, 505)],
        committed=2,
        counted=2,
        outcomes=("ok", "ok"),
    ),
    "disk commit, then its events past the bound: forgotten, counted again": Lifecycle(
        [("committed", 0, 20), *_saves(COUNTED_KEYS, 1), ("late", 0, BOUND + 50)],
        committed=1,
        counted=COUNTED_KEYS + 2,
        outcomes=("ok",) * RECENT,
    ),
    "disk commit, then its events just within the bound: counted once": Lifecycle(
        [("committed", 0, 20), *_saves(COUNTED_KEYS - 1, 1), ("late", 0, BOUND)],
        committed=1,
        counted=COUNTED_KEYS,
        outcomes=("ok",) * RECENT,
    ),
}


@pytest.mark.parametrize("case", LIFECYCLES)
def test_a_saves_entry_counts_its_end_once(case: str) -> None:
    expected = LIFECYCLES[case]
    state = _drive(expected.history).state()
    assert (state.saves_committed, state.saves_aborted, _total_of(state)) == (
        expected.committed, expected.aborted, expected.counted,
    )  # fmt: skip
    assert state.deadline_misses + state.saves_within_deadline == expected.counted
    assert tuple(r.outcome for r in state.recent_saves) == expected.outcomes


def test_the_ledger_keeps_one_entry_per_save_and_no_more_than_the_bound() -> None:
    tracker = _drive([("committed", 0, 20), *_saves(COUNTED_KEYS + 5, 1)])
    assert len(tracker._saves) == COUNTED_KEYS
    assert ("step", 0) not in tracker._saves  # the oldest went first
    entry = tracker._saves[("step", COUNTED_KEYS + 5)]
    assert entry.accounted and not entry.aborted and entry.record is tracker.recent_saves[-1]


def test_the_disks_abort_and_then_its_ranks_save_failed_are_one_abort() -> None:
    """The save stood still (ranks hung in a collective): the disk aborts it after abort_after;
    its ranks report save_failed when they time out, much later. One abort, counted once."""
    tracker = job(deadline=60, abort_after=120)
    tracker.observe(DURABLE, [], T)
    tracker.apply_events([ev("save_start", T + 4, 10)], T + 4)
    tracker.observe(DURABLE, [found("step_10", WRITING, T + 4, step=10, last=T + 5)], T + 6)
    tracker.tick(T + 200)  # nothing moved for abort_after: aborted by the disk
    assert tracker.state().saves_aborted == 1
    tracker.apply_events([ev("save_failed", T + 900, 10)], T + 900)
    tracker.tick(T + 901)
    assert tracker.state().saves_aborted == 1
    # A later attempt at the same step that fails on its own is another abort.
    tracker.apply_events(
        [ev("save_start", T + 5000, 10), ev("save_failed", T + 5010, 10)], T + 5010
    )
    tracker.tick(T + 5011)
    assert tracker.state().saves_aborted == 2


def test_a_save_accounted_without_a_span_does_not_swallow_the_next_one_under_its_key() -> None:
    """The ranks' account of a save whose start line was lost has no window; the next save
    under the same step, a roll-back later, is a save of its own."""
    tracker = job(deadline=60)
    tracker.observe(DURABLE, [], T)
    tracker.apply_events([ev("committed", T + 20, 10)], T + 20)  # its save_start never came
    tracker.tick(T + 21)
    tracker.tick(T + 3600)  # expired or settled, either way accounted
    counted = _total(tracker)
    tracker.apply_events([ev("save_start", T + 5000, 10), ev("committed", T + 5020, 10)], T + 5020)
    tracker.tick(T + 5021)
    assert _total(tracker) == counted + 1
