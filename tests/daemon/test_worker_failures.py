"""A worker task that raises is delivered to the core as a failure, logged once and counted;
it used to vanish, leaving its tiers pending (never read again) or its root listing for good."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from checkpoint_exporter.config import Config, DiscoverConfig, JobConfig, Policy
from checkpoint_exporter.core.jobs import Tracker
from checkpoint_exporter.daemon import discovery, reads
from checkpoint_exporter.daemon.scanner import Scanner
from checkpoint_exporter.daemon.workers import InlineWorker, MountWorker, TaskFailed


def _drain(worker: MountWorker) -> None:
    """Run the worker's queued tasks on this thread, then return (no thread, no waiting)."""
    worker.stop()
    worker._run()


def test_a_task_that_raises_is_delivered_as_a_failure_and_the_next_task_runs() -> None:
    delivered: list[object] = []
    worker = MountWorker("/mnt/data", delivered.append)
    error = RuntimeError("a bug")

    def broken() -> object:
        raise error

    worker.submit(broken, name="read 2 tiers", fallback=lambda e: ("undo", e))
    worker.submit(lambda: "next")
    _drain(worker)
    assert delivered == [TaskFailed("/mnt/data", "read 2 tiers", error, ("undo", error)), "next"]


def test_a_read_batch_that_raises_is_counted_logged_and_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    job = tmp_path / "job"
    job.mkdir()
    config = Config(
        spool=tmp_path / "spool", jobs=(JobConfig("j", job, None, Policy(layout="dcp")),)
    )
    tracker = Tracker(config)
    scanner = Scanner(config, tracker, watcher_factory=None)
    (worker,) = scanner._workers.values()
    _drain(worker)  # the tier is placed
    scanner._turn()  # placed: its first read is sent

    def broken(*args: object) -> object:
        raise RuntimeError("a bug in the read")

    monkeypatch.setattr(reads, "_read_tier", broken)
    caplog.set_level(logging.ERROR)
    _drain(worker)  # the batch raises
    scanner._turn()

    failures = tracker.snapshot.daemon.worker_task_failures
    assert failures == ((worker.mountpoint, 1),)
    failed = [r for r in caplog.records if "read 1 tiers" in r.getMessage()]
    assert len(failed) == 1 and worker.mountpoint in failed[0].getMessage()
    (tier,) = scanner._sources["j"].tiers
    # Not left pending: read again (in full) once its pause is over.
    assert not tier.pending and tier.failures == 1
    assert tier.reconcile_wanted > tier.reconcile_done
    assert scanner._timers.due_at(tier.key) == tier.retry_at


def test_a_root_listing_that_raises_is_counted_and_listed_again_at_its_next_poll(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The listing's failure used to leave the root marked as being listed: never listed again,
    its jobs never found, the exporter never ready."""
    root = tmp_path / "runs"
    (root / "a" / "step-1").mkdir(parents=True)
    (root / "a" / "step-1" / "__0_0.distcp").write_bytes(b"\0")
    policy = Policy(layout="dcp", poll_interval=5.0)
    config = Config(spool=tmp_path / "spool", discover=(DiscoverConfig(root, 10, 3600.0, policy),))
    tracker = Tracker(config)
    mono = [1000.0]
    scanner = Scanner(
        config,
        tracker,
        watcher_factory=None,
        monotonic=lambda: mono[0],
        worker_factory=InlineWorker,
    )
    real = discovery._list_jobs
    calls: list[str] = []

    def fails_once(*args: object) -> object:
        calls.append("list")
        if len(calls) == 1:
            raise RuntimeError("a bug in the listing")
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(discovery, "_list_jobs", fails_once)
    scanner.turn()  # listed (and failed) on the inline worker
    scanner.turn()  # the failure arrives
    assert [n for n, _ in tracker.snapshot.daemon.worker_task_failures] == [
        scanner._lexical_mount(str(root))
    ]
    assert "a" not in tracker.jobs
    mono[0] += policy.poll_interval
    scanner.turn()  # its next poll lists it again
    scanner.turn()
    assert calls == ["list", "list"]
    assert "a" in tracker.jobs
