"""The core's timer queue (daemon/timers.py)."""

from __future__ import annotations

from checkpoint_exporter.daemon.timers import TimerQueue


def test_a_key_set_again_at_the_time_it_is_due_keeps_one_entry() -> None:
    """Setting a key to the time it already has must not pile up heap entries: each would match
    the key's time and survive every compaction, so every later ``at`` walked them all."""
    timers: TimerQueue[str] = TimerQueue()
    for _ in range(1000):
        timers.at("a", 5.0)
    assert len(timers._heap) == 1
    assert timers.pop_due(5.0) == ["a"]
    assert timers.next_due() is None


def test_ties_pop_in_the_order_first_set() -> None:
    timers: TimerQueue[str] = TimerQueue()
    timers.at("a", 1.0)
    timers.at("b", 1.0)
    timers.at("a", 1.0)  # set again at the same time: keeps its place
    timers.at("c", 0.5)
    timers.at("c", 1.0)  # moved: now after the others set at 1.0
    assert timers.pop_due(1.0) == ["a", "b", "c"]
