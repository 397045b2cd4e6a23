"""The core loop turn by turn: a fake clock, an inline worker (a task runs as it is submitted and
its value waits in the inbox for the next turn), no thread, no sleep. Each test is one of the
ordering rules the daemon keeps between its inputs."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from checkpoint_exporter.config import Config, JobConfig, Policy
from checkpoint_exporter.core.inputs import SpoolEvents
from checkpoint_exporter.core.jobs import Tracker
from checkpoint_exporter.core.tracker import ValidationRequest
from checkpoint_exporter.daemon.scanner import SPOOL_POLL_SECONDS, Scanner
from checkpoint_exporter.daemon.timers import JobDue
from checkpoint_exporter.daemon.validator import RETRY_UNCHECKED_SECONDS
from checkpoint_exporter.daemon.workers import InlineWorker
from checkpoint_exporter.events import Event
from checkpoint_exporter.model import JobState, Verdict
from tests.helpers.clocks import Clocks
from tests.helpers.trees import dcp_generation


@dataclass
class Loop:
    scanner: Scanner
    tracker: Tracker
    clocks: Clocks
    job: Path

    def job_state(self) -> JobState:
        (state,) = [s for s in self.tracker.snapshot.jobs if s.name == "j"]
        return state


def _loop(tmp_path: Path) -> Loop:
    job = tmp_path / "job"
    (job / "step-1").mkdir(parents=True)
    (job / "step-1" / "__0_0.distcp").write_bytes(b"\0" * 16)  # a save under way
    config = Config(
        spool=tmp_path / "spool", jobs=(JobConfig("j", job, None, Policy(layout="dcp")),)
    )
    tracker = Tracker(config)
    # The wall clock starts at the files' own time: the tracker dates what it reads by it.
    clocks = Clocks(wall=time.time())
    scanner = Scanner(
        config,
        tracker,
        watcher_factory=None,
        clock=lambda: clocks.wall,
        monotonic=lambda: clocks.mono,
        worker_factory=InlineWorker,
    )
    return Loop(scanner, tracker, clocks, job)


def _first_read(loop: Loop) -> None:
    loop.scanner.turn()  # placed (on the inline worker, while the job was added): read sent
    loop.scanner.turn()  # read applied: the save in progress is known


def test_the_spool_is_read_before_the_disk_results_of_the_same_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Else an instrumented save whose commit is read first is counted twice (once from the
    disk alone, once from its events)."""
    loop = _loop(tmp_path)
    scanner = loop.scanner
    scanner.turn()  # placed; the first read waits in the inbox; the spool's own timer ran
    calls: list[str] = []
    read_spool, read_done = scanner._read_spool, scanner._read_done
    monkeypatch.setattr(scanner, "_read_spool", lambda: (calls.append("spool"), read_spool()))
    monkeypatch.setattr(scanner, "_read_done", lambda r: (calls.append("disk"), read_done(r)))
    scanner.turn()  # the spool's timer is not due: only the read's arrival polls it
    assert calls == ["spool", "disk"]


def test_a_commit_is_published_with_the_sizes_statted_after_it(tmp_path: Path) -> None:
    """The read that sees a generation commit states its files again in full, in the same task:
    the commit is never published with the sizes of the save in progress (nor held back for a
    second read)."""
    loop = _loop(tmp_path)
    scanner = loop.scanner
    (loop.job / "step-1" / "model").mkdir()
    shard = loop.job / "step-1" / "model" / "__0_0.distcp"
    shard.write_bytes(b"\0" * 16)
    _first_read(loop)
    (writing,) = loop.job_state().generations
    assert writing.bytes == 32

    # Nothing told the daemon of the shard growing (a modification the watcher coalesced away,
    # or no watcher at all); the marker's event is the only one.
    shard.write_bytes(b"\0" * 4096)
    (loop.job / "step-1" / ".metadata").write_bytes(b"not parsed here")
    scanner._changed("j", str(loop.job / "step-1" / ".metadata"))
    scanner.turn()  # the event: a read coalesced, not due yet
    loop.clocks.advance(1.0)
    scanner.turn()  # the read is due: sent
    scanner.turn()  # applied: the commit, with every file statted after it
    (committed,) = loop.job_state().generations
    assert committed.state == "committed" and loop.job_state().saves_committed == 1
    assert committed.bytes == 16 + 4096 + len(b"not parsed here")


def test_commits_that_outrun_the_restat_rounds_are_statted_by_the_next_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each re-stat of what committed sees one more generation commit meanwhile: past
    RESTAT_ROUNDS the rest are left to the next read, which states them (they are not kept with
    the sizes of their saves in progress until the hourly reconcile)."""
    loop = _loop(tmp_path)
    scanner = loop.scanner
    shards = {}
    for n in (1, 2, 3, 4):
        (loop.job / f"step-{n}" / "model").mkdir(parents=True)
        shards[n] = loop.job / f"step-{n}" / "model" / "__0_0.distcp"
        shards[n].write_bytes(b"\0" * 16)
    _first_read(loop)
    (tier,) = scanner._sources["j"].tiers
    assert tier.reader is not None
    real_read = tier.reader.read

    def commit(n: int) -> None:  # its shard grew unseen, then its marker came
        shards[n].write_bytes(b"\0" * 4096)
        (loop.job / f"step-{n}" / ".metadata").write_bytes(b"m")

    following = [2, 3, 4]

    def read(hot, **kw):  # type: ignore[no-untyped-def]
        if kw.get("force_paths") and following:
            commit(following.pop(0))  # one more commits while the last ones are statted
        return real_read(hot, **kw)

    monkeypatch.setattr(tier.reader, "read", read)
    commit(1)
    scanner._changed("j", str(loop.job / "step-1" / ".metadata"))
    for _ in range(3):
        scanner.turn()
        loop.clocks.advance(1.0)
    # Step 3 committed during the last round: published as listed, its re-stat left to the
    # next read, which its marker's event (the watcher's) brings.
    assert following == [4]
    scanner._changed("j", str(loop.job / "step-3" / ".metadata"))
    for _ in range(3):
        scanner.turn()
        loop.clocks.advance(1.0)
    sizes = {g.id: g.bytes for g in loop.job_state().generations}
    assert sizes == {"step-1": 16 + 4096 + 1, "step-2": 4097, "step-3": 4097, "step-4": 4097}


def test_a_validation_retry_is_a_timer(tmp_path: Path) -> None:
    """A generation whose checks could not run is asked again after RETRY_UNCHECKED_SECONDS on
    the job's timer, not by reading the tier again meanwhile."""
    loop = _loop(tmp_path)
    scanner = loop.scanner
    _first_read(loop)
    requests: list[ValidationRequest] = []
    (validator,) = scanner._validators.values()
    validator.submit = lambda request, *_, **__: requests.append(request)  # type: ignore
    (loop.job / "step-1" / ".metadata").write_bytes(b"not parsed here")
    scanner._changed("j", str(loop.job / "step-1" / ".metadata"))
    for _ in range(4):
        scanner.turn()
        loop.clocks.advance(1.0)
    (request,) = requests
    reads = sum(scanner._scans.state().counts)

    scanner._verdicts.put((request, Verdict(False, unchecked=True)))
    asked = loop.clocks.mono
    scanner.turn()
    assert scanner._timers.due_at(JobDue("j")) is not None  # the job's timer is armed
    while len(requests) < 2 and loop.clocks.mono - asked < 2 * RETRY_UNCHECKED_SECONDS:
        loop.clocks.advance(1.0)
        scanner.turn()
        assert sum(scanner._scans.state().counts) == reads  # the tier is never read for it
    assert [r.generation for r in requests] == [request.generation] * 2
    # Asked again on the turn its timer fires, from what the last read saw.
    assert RETRY_UNCHECKED_SECONDS <= loop.clocks.mono - asked <= RETRY_UNCHECKED_SECONDS + 1


def test_what_a_jobs_clocks_refuse_is_counted_once_and_outlives_the_job(tmp_path: Path) -> None:
    """The job's clocks keep their own count (the core writes into no source's counter); the
    scrape's spool_dropped adds them to the reader's, and a job forgotten takes none away: the
    counter never goes down."""
    loop = _loop(tmp_path)
    _first_read(loop)
    wall = loop.clocks.wall
    late = [
        Event(wall, "save_start", "j", 7, 0, 1, "h", None, None, None),
        Event(wall - 3600, "committed", "j", 7, 0, 1, "h", None, None, None),  # before its start
    ]
    loop.scanner._apply("j", SpoolEvents(late, wall))
    loop.scanner.turn()
    dropped = dict(loop.tracker.snapshot.daemon.spool_dropped)
    assert dropped.get("before_start") == 1
    assert loop.scanner.spool.dropped_total["before_start"] == 0  # the reader's own, untouched
    loop.scanner.reload(replace(loop.scanner.config, jobs=()))
    loop.scanner.turn()
    assert "j" not in loop.tracker.jobs
    assert dict(loop.tracker.snapshot.daemon.spool_dropped).get("before_start") == 1


def test_a_placement_that_raises_is_placed_again_after_a_pause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tier whose placement raised was never placed again: never read, never ready."""
    calls: list[str] = []
    place = Scanner._place

    def flaky(self: Scanner, tier, policy):  # type: ignore[no-untyped-def]
        calls.append(tier.path)
        if len(calls) == 1:
            raise RuntimeError("a bug in placing")
        return place(self, tier, policy)

    monkeypatch.setattr(Scanner, "_place", flaky)
    loop = _loop(tmp_path)
    scanner = loop.scanner
    scanner.turn()  # the failure arrives: counted, placed again after a pause
    (tier,) = scanner._sources["j"].tiers
    assert tier.reader is None and tier.place_failed and len(calls) == 1
    for _ in range(5):
        loop.clocks.advance(1.0)
        scanner.turn()
    assert len(calls) == 2 and tier.reader is not None
    assert dict(loop.tracker.snapshot.daemon.worker_task_failures) == {tier.worker: 1}
    assert scanner.readiness() is None


def test_a_polled_tier_is_read_at_its_poll_interval(tmp_path: Path) -> None:
    """A tier no watcher follows (a network filesystem, ``watch: poll``) sees a new generation
    at its next poll: not before its poll_interval, and at the turn it comes due."""
    job = tmp_path / "job"
    job.mkdir()
    policy = Policy(layout="dcp", watch="poll", poll_interval=2.0)
    config = Config(spool=tmp_path / "spool", jobs=(JobConfig("j", job, None, policy),))
    tracker = Tracker(config)
    clocks = Clocks(wall=time.time())
    scanner = Scanner(
        config, tracker, watcher_factory=None, clock=lambda: clocks.wall,
        monotonic=lambda: clocks.mono, worker_factory=InlineWorker,
    )  # fmt: skip

    def seen() -> bool:
        (state,) = tracker.snapshot.jobs
        return any(g.id == "step-5" for g in state.generations)

    scanner.turn()
    scanner.turn()  # the first read applied: the tier's next poll is due poll_interval later
    polled_at = clocks.mono
    dcp_generation(job / "step-5")  # no watch event: only a poll finds it
    while clocks.mono + 0.25 < polled_at + policy.poll_interval:
        clocks.advance(0.25)
        scanner.turn()
        assert not seen()  # not read before its interval
    clocks.advance(0.5)  # past the interval (on the poll's 0.25 s grid)
    for _ in range(3):  # sent, applied (and held for the full read of a commit), read again
        scanner.turn()
    assert seen()


def test_a_spool_training_jobs_cannot_write_stays_reported_until_it_is_fixed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kubelet's 0755 spool is unwritable at every check, however many pass; 1733 is
    writable from the next check on."""
    loop = _loop(tmp_path)
    spool = loop.scanner.config.spool
    spool.mkdir(mode=0o755)
    os.chmod(spool, 0o755)
    checks: list[float] = []
    check = loop.scanner._check_spool
    monkeypatch.setattr(loop.scanner, "_check_spool", lambda: (checks.append(0.0), check()))

    def writable() -> bool | None:
        return loop.tracker.snapshot.daemon.spool_writable

    loop.scanner.turn()
    assert len(checks) == 1 and writable() is False
    while len(checks) < 4:  # three checks more, on the loop's own cadence
        loop.clocks.advance(SPOOL_POLL_SECONDS)
        loop.scanner.turn()
        assert writable() is False
    os.chmod(spool, 0o1733)
    while len(checks) < 5:
        loop.clocks.advance(SPOOL_POLL_SECONDS)
        loop.scanner.turn()
    assert writable() is True
