"""One call into the core: a job's life driven through ``JobTracker.apply`` alone."""

from __future__ import annotations

import pytest

from checkpoint_exporter.core.inputs import (
    Effects,
    PathsPlaced,
    SpoolEvents,
    Tick,
    TierRead,
    VerdictIn,
    WindowTelemetryIn,
)
from checkpoint_exporter.model import (
    COMMITTED,
    DURABLE,
    STAGING,
    WRITING,
    Verdict,
    WatchedPath,
    WindowTelemetry,
)

from .builders import T, ev, found, job


def test_a_save_from_first_write_to_its_diagnosis() -> None:
    tracker = job(deadline=60, abort_after=300)
    first = tracker.apply(TierRead(DURABLE, [], T))
    assert first.changed and first.next_due is None and not first.saves_in_progress
    writing = tracker.apply(TierRead(DURABLE, [found("step_1", WRITING, T + 1, step=1)], T + 2))
    assert writing.hot == ((DURABLE, ("step_1",)),)
    assert writing.saves_in_progress
    assert writing.next_due == pytest.approx(T + 2 + 300, abs=0.1)  # its abort deadline
    done = found("step_1", COMMITTED, T + 1, T + 20, step=1)
    committed = tracker.apply(TierRead(DURABLE, [done], T + 21))
    assert [r.generation for r in committed.validations] == ["step_1"]
    assert committed.hot == ((DURABLE, ()),) and not committed.saves_in_progress
    assert committed.correlate == (T + 1, T + 20)
    # Read again: the request already on its way is not repeated.
    assert tracker.apply(TierRead(DURABLE, [done], T + 21)).validations == ()
    judged = tracker.apply(VerdictIn(committed.validations[0], Verdict(True), T + 22))
    assert judged.changed
    assert tracker.state().last_committed_valid is True
    telemetry = WindowTelemetry(T + 1, T + 20, network_transmit_bytes=5.0)
    correlated = tracker.apply(WindowTelemetryIn(telemetry, T + 30))
    assert correlated.changed and correlated.correlate is None and correlated.next_due is None
    state = tracker.state()
    assert (state.saves_committed, state.window) == (1, telemetry)


def test_a_save_that_stops_is_aborted_at_the_tick_it_asked_for() -> None:
    tracker = job(deadline=60, abort_after=120)
    tracker.apply(TierRead(DURABLE, [], T))
    effects = tracker.apply(TierRead(DURABLE, [found("s", WRITING, T + 1)], T + 2))
    assert effects.next_due is not None
    early = tracker.apply(Tick(effects.next_due - 1))
    assert not early.changed and early.saves_in_progress
    late = tracker.apply(Tick(effects.next_due))
    assert late.changed and not late.saves_in_progress and late.next_due is None
    assert tracker.state().saves_aborted == 1
    for later in (1.0, 2.0, 3.0):  # reads and ticks after it: counted once, not on every one
        now = effects.next_due + later
        again = tracker.apply(TierRead(DURABLE, [found("s", WRITING, T + 1)], now))
        assert not again.saves_in_progress
        tracker.apply(Tick(now + 0.5))
    assert tracker.state().saves_aborted == 1


def test_spool_events_are_settled_by_the_tick_they_ask_for() -> None:
    tracker = job(deadline=60)
    tracker.apply(TierRead(DURABLE, [], T))
    events = [ev("save_start", T), ev("written", T + 5), ev("committed", T + 6)]
    effects = tracker.apply(SpoolEvents(events, T + 7))
    assert effects.changed and effects.next_due is not None and effects.next_due > T + 7
    settled = tracker.apply(Tick(effects.next_due))
    assert settled.changed
    assert dict(tracker.state().last_phases)["total"] == 6.0
    assert settled.correlate == (T, T + 6)


def test_a_validation_without_a_verdict_is_asked_again() -> None:
    tracker = job()
    tracker.apply(TierRead(DURABLE, [], T))
    tracker.apply(TierRead(DURABLE, [found("s", WRITING, T)], T + 1))
    done = found("s", COMMITTED, T, T + 2)
    request = tracker.apply(TierRead(DURABLE, [done], T + 3)).validations[0]
    # It moved while it was read: its tier is read again now, and asks for it again.
    moved = tracker.apply(VerdictIn(request, None, T + 4))
    assert moved.rescan == (DURABLE,)
    again = tracker.apply(TierRead(DURABLE, [done], T + 4))
    assert [r.generation for r in again.validations] == ["s"]
    # Its checks could not run: asked again at not_before, through the tick.
    tracker.apply(Tick(T + 20))  # the save's diagnosis no longer waits for its telemetry
    unchecked = tracker.apply(VerdictIn(request, Verdict(False, unchecked=True), T + 21, T + 600))
    assert unchecked.rescan == () and unchecked.next_due == T + 600
    assert tracker.apply(Tick(T + 599)).validations == ()
    retried = tracker.apply(Tick(T + 600))  # a timer: asked again without reading the tier
    assert retried.rescan == () and [r.generation for r in retried.validations] == ["s"]
    assert tracker.apply(TierRead(DURABLE, [done], T + 601)).validations == ()  # on its way


def test_paths_placed_change_the_job_only_when_they_differ() -> None:
    tracker = job(two_tier=True)
    placed = (WatchedPath(DURABLE, "/ckpt/j", "poll"), WatchedPath(STAGING, "/nvme/j", "inotify"))
    effects = tracker.apply(PathsPlaced(placed, T))
    assert effects.changed and effects.hot == ((DURABLE, ()), (STAGING, ()))
    assert not tracker.apply(PathsPlaced(placed, T + 1)).changed
    assert tracker.state().paths == placed


def test_anything_else_is_refused() -> None:
    with pytest.raises(TypeError):
        job().apply(object())  # type: ignore[arg-type]
    assert Effects() == Effects(changed=False)
