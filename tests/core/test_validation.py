"""Validation bookkeeping (core/validation.py): requests, verdicts, retries."""

from __future__ import annotations

from checkpoint_exporter.model import COMMITTED, DURABLE, WRITING, Verdict

from .builders import T, found, job


def _committed():
    tracker = job()
    tracker.observe(DURABLE, [], T)
    tracker.observe(DURABLE, [found("s", WRITING, T, step=1)], T + 1)
    observed = tracker.observe(DURABLE, [found("s", COMMITTED, T, T + 5, step=1)], T + 6)
    return tracker, observed.requests


def test_a_committed_generation_is_asked_for_once_per_signature() -> None:
    tracker, requests = _committed()
    assert [r.generation for r in requests] == ["s"]
    tracker.submitted(requests[0])
    again = tracker.observe(DURABLE, [found("s", COMMITTED, T, T + 5, step=1)], T + 7)
    assert again.requests == []


def test_a_verdict_for_an_older_signature_is_dropped() -> None:
    tracker, requests = _committed()
    tracker.submitted(requests[0])
    tracker.observe(DURABLE, [found("s", COMMITTED, T, T + 5, step=1, size=20)], T + 7)
    tracker.apply_verdict(requests[0], Verdict(False, "missing_shard"))
    assert tracker.state().validation_failures == ()
    assert tracker.state().generations[0].valid is None


def test_an_invalid_verdict_is_counted_for_a_live_save_not_for_history() -> None:
    tracker, requests = _committed()
    tracker.apply_verdict(requests[0], Verdict(False, "missing_shard"))
    assert tracker.state().validation_failures == (("missing_shard", 1),)
    history = job()
    old = history.observe(DURABLE, [found("h", COMMITTED, T, T + 5)], T + 100).requests
    history.apply_verdict(old[0], Verdict(False, "missing_shard"))
    assert history.state().validation_failures == ()
    assert history.state().generations[0].valid is False


def test_an_unchecked_generation_is_asked_again_when_its_retry_is_due() -> None:
    tracker, requests = _committed()
    tracker.submitted(requests[0])
    tracker.retry_validation(requests[0], not_before=T + 60)
    tracker.tick(T + 30)  # the save's diagnosis no longer waits for telemetry
    assert tracker.next_due(T + 30) == T + 60
    assert not tracker.validation_retry_due(T + 59)
    assert tracker.observe(DURABLE, [requests[0].found], T + 59).requests == []
    assert tracker.validation_retry_due(T + 60)
    assert not tracker.validation_retry_due(T + 61)  # taken: one rescan per retry
    assert [
        r.generation for r in tracker.observe(DURABLE, [requests[0].found], T + 61).requests
    ] == ["s"]
