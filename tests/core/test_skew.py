"""The storage clock's offset (core/skew.py)."""

from __future__ import annotations

from checkpoint_exporter.core.skew import (
    SKEW_FUTURE,
    SKEW_HOLD,
    SKEW_SAMPLES,
    SKEW_TOLERANCE,
    StorageClock,
    skew_tolerance,
)


def test_the_estimate_is_the_largest_recent_sample() -> None:
    clock = StorageClock()
    assert clock.estimate() is None and clock.gauge is None
    for offset in (118.0, 120.0, 119.5):  # detection latency only makes samples smaller
        clock.sample(offset, 0.0)
    assert clock.estimate() == 120.0


def test_one_file_dated_far_ahead_is_reported_not_used() -> None:
    clock = StorageClock()
    for _ in range(5):
        clock.sample(1.0, 10.0)
    clock.sample(200.0, 10.0)  # over the median by more than SKEW_OUTLIER
    clock.saw(10.0)
    assert clock.estimate() == 1.0
    assert clock.gauge == 200.0
    assert clock.local_time(1_000.0, skew_tolerance(5.0)) == 1_000.0


def test_the_held_offset_expires_on_the_reads_clock() -> None:
    clock = StorageClock()
    clock.sample(200.0, 0.0)
    for _ in range(SKEW_SAMPLES):
        clock.sample(1.0, 1.0)  # pushed out of the samples
    clock.saw(SKEW_HOLD)
    assert clock.gauge == 200.0
    clock.saw(SKEW_HOLD + 1.0)
    assert clock.gauge == 1.0


def test_a_date_beyond_the_future_bound_never_enters_the_estimate() -> None:
    clock = StorageClock()
    clock.sample(SKEW_FUTURE + 1.0, 0.0)
    assert clock.estimate() is None
    assert clock.gauge is None  # nothing to hold it against: no estimate, no gauge


def test_a_date_behind_is_never_held() -> None:
    clock = StorageClock()
    clock.sample(-10_000.0, 0.0)  # an old file copied with its times
    assert clock.held is None
    assert clock.gauge == -10_000.0


def test_times_move_onto_the_local_clock_only_beyond_the_tolerance() -> None:
    clock = StorageClock()
    clock.sample(30.0, 0.0)
    assert clock.local_time(1_000.0, skew_tolerance(60.0)) == 1_000.0  # within a poll
    assert clock.local_time(1_000.0, skew_tolerance(5.0)) == 970.0


def test_the_tolerance_is_a_poll_and_a_second_at_least_two_seconds() -> None:
    assert skew_tolerance(0.1) == SKEW_TOLERANCE
    assert skew_tolerance(10.0) == 11.0
