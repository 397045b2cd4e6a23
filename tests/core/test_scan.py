"""Tier reads (core/scan.py): what a read can and cannot tell."""

from __future__ import annotations

from checkpoint_exporter.model import COMMITTED, DURABLE, WRITING

from .builders import T, found, job


def test_a_tier_whose_root_cannot_be_read_at_first_is_not_read_yet() -> None:
    tracker = job()
    assert tracker.observe(DURABLE, [], T, unreadable=[""]).requests == []
    tracker.observe(DURABLE, [found("old", COMMITTED, T - 50, T - 40)], T + 1)
    assert tracker.state().saves_committed == 0  # the first real read: history


def test_what_cannot_be_read_is_kept_as_last_known_and_never_aborted() -> None:
    tracker = job(abort_after=60)
    tracker.observe(DURABLE, [], T)
    tracker.observe(DURABLE, [found("a/s1", WRITING, T + 1)], T + 2)
    tracker.observe(DURABLE, [], T + 3, unreadable=["a"])
    tracker.tick(T + 1_000)
    assert {g.id: g.state for g in tracker.state().generations} == {"a/s1": WRITING}
    assert tracker.next_due(T + 1_000) is None  # judged again once a read can see it
    # Written before it was hidden, first seen once readable: history, not a save.
    tracker.observe(DURABLE, [found("a/s1", WRITING, T + 1), found("a/s0", COMMITTED, T, T + 1)],
                    T + 1_001)  # fmt: skip
    assert tracker.state().saves_committed == 0


def test_hot_directories_are_the_generations_being_written() -> None:
    tracker = job()
    tracker.observe(DURABLE, [], T)
    tracker.observe(
        DURABLE, [found(".", WRITING, T), found("b", WRITING, T), found("c", COMMITTED, T, T)],
        T + 1,
    )  # fmt: skip
    assert tracker.hot_directories(DURABLE) == ["", "b"]
    assert tracker.has_saves_in_progress()
