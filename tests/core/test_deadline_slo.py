"""checkpoint_saves_within_deadline_total: counted where the deadline misses are, never for
history, exported beside the histogram, and what the SLO recording rules read instead of its
buckets."""

from __future__ import annotations

from prometheus_client import generate_latest

from checkpoint_exporter.config import Policy
from checkpoint_exporter.core.tracker import JobTracker
from checkpoint_exporter.exposition.collectors.checkpoints import CheckpointsCollector
from checkpoint_exporter.exposition.renderer import Renderer
from checkpoint_exporter.mixin import rules
from checkpoint_exporter.mixin.config import MixinConfig
from checkpoint_exporter.model import COMMITTED, DURABLE, WRITING, Snapshot, WatchedPath
from checkpoint_exporter.sources.layouts.base import DCP, Check, Found
from tests.conftest import sample

T = 1_800_000_000.0


def found(gen_id: str, state: str, start: float, commit: float | None = None) -> Found:
    last = commit if commit is not None else start
    return Found(gen_id, None, state, start, last, commit, 10, 1, (Check(DCP, "x"),))


def test_within_and_missed_partition_the_observed_saves_and_history_counts_neither() -> None:
    tracker = JobTracker("j", (WatchedPath(DURABLE, "/x"),), Policy(deadline=60))
    # Found at start-up: history, whatever its duration.
    history = [found("old-fast", COMMITTED, T, T + 5), found("old-slow", COMMITTED, T, T + 500)]
    tracker.observe(DURABLE, history, T + 1000)
    assert (tracker.state().saves_within_deadline, tracker.state().deadline_misses) == (0, 0)
    seen = list(history)
    for gen_id, start, seconds in (("a", 1100, 30), ("b", 1200, 60), ("c", 1300, 61)):
        tracker.observe(DURABLE, [*seen, found(gen_id, WRITING, T + start)], T + start + 1)
        seen.append(found(gen_id, COMMITTED, T + start, T + start + seconds))
        tracker.observe(DURABLE, seen, T + start + seconds + 1)
    state = tracker.state()
    # Exactly the deadline is within it, as the histogram's bucket at the deadline counts it.
    assert (state.saves_within_deadline, state.deadline_misses) == (2, 1)
    total = dict(state.save_duration)["total"]
    assert state.saves_within_deadline + state.deadline_misses == total.count
    assert dict(total.cumulative())[60] == state.saves_within_deadline


def test_the_counter_is_exported_beside_the_histogram() -> None:
    tracker = JobTracker("j", (WatchedPath(DURABLE, "/x"),), Policy(deadline=60))
    tracker.observe(DURABLE, [], T)
    tracker.observe(DURABLE, [found("a", WRITING, T + 1)], T + 2)
    tracker.observe(DURABLE, [found("a", COMMITTED, T + 1, T + 11)], T + 12)
    snapshot = Snapshot(jobs=(tracker.state(),))
    text = Renderer(lambda: snapshot, [CheckpointsCollector()]).render(generate_latest).decode()
    assert "# TYPE checkpoint_saves_within_deadline_total counter" in text
    assert sample(text, "checkpoint_saves_within_deadline_total", training_job="j") == 1
    histogram = text.index("checkpoint_save_duration_seconds_bucket")
    assert histogram < text.index("checkpoint_saves_within_deadline_total")


def test_slo_ratios_read_two_series_per_job_not_the_buckets() -> None:
    recorded = {
        rule["record"]: rule["expr"]
        for group in rules.rule_groups(MixinConfig())["groups"]
        for rule in group["rules"]
        if "record" in rule
    }
    for window in rules.SLO_WINDOWS:
        expr = recorded[rules.slo_errors(window)]
        assert "checkpoint_saves_within_deadline_total{" in expr and f"[{window}]" in expr
        assert (
            'checkpoint_save_duration_seconds_count{job="checkpoint-exporter",phase="total"}'
            in expr
        )
        assert "_bucket" not in expr and "checkpoint_deadline_bucket_info" not in expr
